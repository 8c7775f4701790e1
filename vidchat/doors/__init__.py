"""The doors: adapters between a wire format and the conversation core. The
page (Gradio), the WebRTC peers that feed it, the seed WebSocket protocol,
and the "what the model got" view. A door translates; rules live below it
(vidchat.conversation). Doors use the engine's interface, never an engine."""
