"""Published OpenAI Realtime clients driving vidchat's /v1/realtime unchanged,
for tests/test_realtime_clients.py. It runs in .venv-clients (scripts/setup.sh
--test builds it from tests/realtime_clients_requirements.txt): openai-agents
pins websockets<17, which vidchat's own environment is above.

    .venv-clients/bin/python tests/realtime_clients.py {livekit,agents} BASE_URL MODEL [TOKEN]

Each scenario uses the package's own API with its default settings, as an
app would, and prints one JSON object on stdout: every raw server event the
package received (as the package itself exposes them) and what its API
calls returned. The test asserts on those; nothing here judges the server.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import logging
import sys
from typing import Any, Awaitable, Callable

INSTRUCTIONS = "You watch a camera. Answer in one short sentence."
WAIT_S = 120.0  # a response on a loaded 2-core machine; the test's own timeout is the real bound


def frame_rgba(width: int = 64, height: int = 48) -> bytes:
    """A picture with something in it (a gradient and a square), as RGBA bytes."""
    pixels = bytearray()
    for y in range(height):
        for x in range(width):
            inside = 16 <= x < 40 and 12 <= y < 36
            pixels += bytes((255 if inside else x * 4, 40 if inside else y * 5, 90, 255))
    return bytes(pixels)


def frame_jpeg_url() -> str:
    """The same picture as a JPEG data URL (Pillow comes with livekit-agents' dependencies)."""
    from PIL import Image

    out = io.BytesIO()
    Image.frombytes("RGBA", (64, 48), frame_rgba()).convert("RGB").save(out, "JPEG")
    return "data:image/jpeg;base64," + base64.b64encode(out.getvalue()).decode()


class Events:
    """The raw server events, in order, and a wait for the next ones of a type."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self._changed = asyncio.Event()

    def add(self, event: dict[str, Any]) -> None:
        self.seen.append(event)
        self._changed.set()

    def count(self, kind: str) -> int:
        return sum(e.get("type") == kind for e in self.seen)

    async def until(self, kind: str, count: int) -> None:
        """Until ``count`` events of type ``kind`` have arrived in all, or an
        ``error`` (then what was asked may never come: the test reads the error)."""
        errors = self.count("error")
        async with asyncio.timeout(WAIT_S):
            while self.count(kind) < count and self.count("error") == errors:
                self._changed.clear()
                await self._changed.wait()


async def records(base_url: str, token: str, events: Events) -> list[dict[str, Any]]:
    """The answer record of each response.done (vidchat's extra names where it
    is): what the model was given. Read while the session is open, which keeps it."""
    import aiohttp

    found = []
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}) as http:
        for event in events.seen:
            url = (event.get("vidchat") or {}).get("record_url") if event.get("type") == "response.done" else None
            if url:
                async with http.get(base_url + url) as reply:
                    found.append(await reply.json() if reply.status == 200 else {"status": reply.status})
    return found


async def outcome(call: Callable[[], Awaitable[Any]]) -> tuple[Any, str | None]:
    """``call()``'s result, or the error the package raised (its text)."""
    try:
        return await call(), None
    except Exception as exc:  # noqa: BLE001 - what the package raised is the observation
        return None, f"{type(exc).__name__}: {exc}"


async def livekit(base_url: str, model: str, token: str) -> dict[str, Any]:
    """LiveKit's OpenAI realtime plugin without a room: the session an
    AgentSession drives, called as the agent framework calls it."""
    import aiohttp
    from livekit import rtc
    from livekit.agents import llm
    from livekit.plugins.openai.realtime import RealtimeModel

    events, out = Events(), {}
    async with aiohttp.ClientSession() as http:
        session = RealtimeModel(base_url=f"{base_url}/v1", model=model, api_key=token, modalities=["text"],
                                http_session=http).session()
        session.on("openai_server_event_received", events.add)
        await events.until("session.updated", 1)  # the plugin's own first session.update, its defaults
        await session.update_instructions(INSTRUCTIONS)
        await events.until("session.updated", 2)
        session.push_video(rtc.VideoFrame(64, 48, rtc.VideoBufferType.RGBA, frame_rgba()))
        await events.until("conversation.item.done", 1)
        # The chat as the plugin replays it after a reconnect: a user turn, the assistant's answer, a system note.
        chat = session.chat_ctx.copy()
        chat.add_message(role="user", content="Hello, are you there?")
        chat.add_message(role="assistant", content="Yes, I am watching.")
        chat.add_message(role="system", content="The user is in a kitchen.")
        _, out["update_chat_ctx_error"] = await outcome(lambda: session.update_chat_ctx(chat))
        # generate_reply() matches its response by response.metadata.client_event_id (10 s, else it raises).
        generation, out["generate_reply_error"] = await outcome(session.generate_reply)
        text = ""
        if generation is not None:
            async for message in generation.message_stream:
                async for chunk in message.text_stream:
                    text += chunk
        out["streamed_text"] = text
        await events.until("response.done", 1)
        out["records"] = await records(base_url, token, events)
        await session.aclose()
    return {**out, "events": events.seen}


async def agents(base_url: str, model: str, token: str) -> dict[str, Any]:
    """The OpenAI Agents SDK's realtime runner with its default model settings:
    each send_message is an item and its own response.create."""
    from agents.realtime import RealtimeAgent, RealtimeRunner

    events, out = Events(), {}
    runner = RealtimeRunner(RealtimeAgent(name="viewer", instructions=INSTRUCTIONS))
    ws_url = base_url.replace("http", "ws", 1) + f"/v1/realtime?model={model}"
    session = await runner.run(model_config={"url": ws_url, "api_key": token})
    async with session:
        async def read() -> None:
            async for event in session:
                if event.type == "raw_model_event" and event.data.type == "raw_server_event":
                    events.add(event.data.data)

        reader = asyncio.create_task(read())
        await events.until("session.updated", 1)
        _, out["text_message_error"] = await outcome(lambda: session.send_message("What do you see?"))
        await events.until("response.done", 1)
        # A picture alone, as an app sends its camera: the SDK asks a response for it too.
        picture = {"type": "message", "role": "user", "content": [{"type": "input_image",
                                                                    "image_url": frame_jpeg_url()}]}
        _, out["image_message_error"] = await outcome(lambda: session.send_message(picture))
        await events.until("response.done", 2)
        out["records"] = await records(base_url, token, events)
        reader.cancel()
    return {**out, "events": events.seen}


def main() -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    scenario, base_url, model = sys.argv[1:4]
    token = sys.argv[4] if len(sys.argv) > 4 else "no-token-needed"
    result = asyncio.run({"livekit": livekit, "agents": agents}[scenario](base_url, model, token))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
