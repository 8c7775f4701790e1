"""The WebSocket doors: the transport and session loop they share, the seed
protocol (``/v1/video/chat/stream``) and the OpenAI Realtime protocol (``/v1/realtime``)."""
