"""Fuzzing the seed WebSocket protocol against the real server (issue 10).

Hypothesis generates batches of malformed messages (as small "recipes" that
are turned into the actual bytes here, so megabyte strings cost nothing to
generate): random bytes as binary and text frames, wrong and missing fields
and types, huge strings, invalid base64, non-images, image bombs, deeply
nested JSON, pathological numbers, out-of-order messages. They go to two
sessions at once, which are replaced by fresh ones every few batches.

Asserted:
* the server never crashes: the process stays up, /api/health stays ok, and
  its log shows no traceback (no uncaught error, no "handling … failed");
* no session that was not deliberately closed ever closes, every server
  message is a JSON object with a type, and no error is an internal one;
* after its last batch every session still answers a valid question
  (frames, video.query, response.start … response.text.done with stats);
* messages before session.config and a session.config with bad values end
  the session deliberately: an error, then close code 1008 (never 1011);
  video.done before any frame ends it normally (1000).
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import struct
import time
import zlib

import pytest
import websockets
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from PIL import Image

from vidchat.devtools import synthetic

pytestmark = pytest.mark.engine

MIN_MESSAGES = 5000
BATCHES = 150  # hypothesis examples; each is one batch split over the two live sessions
BATCHES_PER_SESSION = 25  # then the pair is checked (a valid question) and replaced
HUGE_BUDGET = 120 * 1024 * 1024  # bytes of megabyte-sized messages in all; then they shrink
CONFIG = {"type": "session.config", "model": "fuzz", "max_tokens": 4, "temperature": 0.0,
          "num_sample_frames": 4, "max_frames": 16}

# ---- payloads ---------------------------------------------------------------

JPEGS = synthetic.cuts_clip(96, 128, cuts=6, hold=1).jpegs()
JPEG_B64 = [base64.b64encode(j).decode() for j in JPEGS]


def _encode(fmt: str, size=(32, 24)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, (200, 30, 30)).save(buf, fmt)
    return buf.getvalue()


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_bomb(w: int, h: int, mode: int = 2) -> bytes:
    """A tiny PNG whose header claims w×h pixels."""
    ihdr = struct.pack(">IIBBBBB", w, h, 8, mode, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", zlib.compress(b"\x00" * 64))
            + _chunk(b"IEND", b""))


def jpeg_claiming(w: int, h: int) -> bytes:
    """A real small JPEG with its frame header patched to claim w×h."""
    data = bytearray(JPEGS[0])
    sof = data.index(b"\xff\xc0")
    data[sof + 5:sof + 9] = struct.pack(">HH", h, w)
    return bytes(data)


def webp_claiming(w: int, h: int) -> bytes:
    """A lossless WebP header claiming w×h (at most 16384 a side) with no image data."""
    bits = (w - 1) | ((h - 1) << 14)
    body = b"VP8L" + struct.pack("<I", 5) + b"\x2f" + struct.pack("<I", bits) + b"\x00"
    return b"RIFF" + struct.pack("<I", 4 + len(body)) + b"WEBP" + body


# A deflate stream of 4097×4097 black RGB pixels: ~50 KB that would decode to 50 MB.
_ROW = b"\x00" + b"\x00" * (4097 * 3)
BIG_PNG = (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", 4097, 4097, 8, 2, 0, 0, 0))
           + _chunk(b"IDAT", zlib.compress(_ROW * 4097, 9)) + _chunk(b"IEND", b""))

BLOBS = {
    "gif": _encode("GIF"), "bmp": _encode("BMP"), "tiff": _encode("TIFF"), "ico": _encode("ICO"),
    "truncated_jpeg": JPEGS[1][:200], "jpeg_head": JPEGS[1][:4], "png_sig": b"\x89PNG\r\n\x1a\n",
    "png_bomb": png_bomb(30000, 30000), "png_bomb_max": png_bomb(2**31 - 1, 2**31 - 1),
    "png_bomb_grey": png_bomb(100_000, 1000, 0), "png_zero": png_bomb(0, 0),
    "jpeg_bomb": jpeg_claiming(65535, 65535), "jpeg_zero": jpeg_claiming(0, 0),
    "webp_bomb": webp_claiming(16384, 16384), "big_png": BIG_PNG, "text": b"hello, not an image",
    "empty_riff": b"RIFF\x00\x00\x00\x00WEBP", "zeros": b"\x00" * 1000,
}

# ---- recipes (what hypothesis draws) ------------------------------------------

WEIRD_NUMBERS = [2**63, 2**64, -2**63 - 1, 10**30, -1, 0, 1e308, -1e308, 1e-320, 0.5, -0.0]
WEIRD_STRINGS = ["", " ", "\x00", "\ud800", "\udfff x", "é" * 10, "null", "video.frame", "<script>", "%s%n"]

scalars = (st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=True)
           | st.text(max_size=12) | st.sampled_from(WEIRD_NUMBERS) | st.sampled_from(WEIRD_STRINGS))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=6)
# Values for session.update/config fields; max_tokens never gets a valid large number (answers stay short).
bad_values = json_values | st.sampled_from([float("nan"), float("inf"), -float("inf"), [], {}, [1], {"x": 1}])
CONFIG_KEYS = ["max_frames", "num_sample_frames", "evs_enabled", "evs_threshold", "system_prompt", "sampling",
               "sample_seconds", "keepalive_s", "audio_mode", "audio_last_seconds", "frames_as", "temperature",
               "include_audio", "seed", "num_frames", "enable_frame_filter", "frame_filter_threshold", "model",
               "modalities", "unknown_key"]
TYPES = ["video.frame", "audio.chunk", "video.query", "ping", "session.update", "session.config",
         "video.rewind", "response.start", "error", "VIDEO.FRAME", "video.frame ", ""]

r_bytes = st.tuples(st.just("bytes"), st.binary(max_size=48))
r_text = st.tuples(st.just("text"), st.text(max_size=48))
r_json = st.tuples(st.just("json"), json_values)
r_fields = st.tuples(
    st.just("msg"),
    st.sampled_from(TYPES) | scalars | st.lists(scalars, max_size=2),
    st.dictionaries(st.sampled_from(["data", "text", "pts_ms", "type", *CONFIG_KEYS]), bad_values, max_size=4),
)
r_update = st.tuples(
    st.just("msg"), st.sampled_from(["session.update", "session.config"]),
    st.dictionaries(st.sampled_from(CONFIG_KEYS), bad_values, max_size=3)
    | st.fixed_dictionaries({"max_tokens": st.sampled_from([0, -1, 10**9, 2**64, 4.5, "4", None, True])}),
)
r_huge = st.tuples(st.just("huge"),
                   st.sampled_from(["raw", "type", "query", "frame_zeros", "frame_junk", "audio", "key",
                                    "json_string", "system_prompt", "bad_json"]),
                   st.sampled_from([2_000, 70_000, 300_000, 1_500_000, 3_000_000]))
r_b64 = st.tuples(st.just("b64"), st.sampled_from(["video.frame", "audio.chunk"]),
                  st.sampled_from(sorted(BLOBS)) | st.binary(max_size=32), st.booleans())
r_badb64 = st.tuples(st.just("badb64"), st.sampled_from(["video.frame", "audio.chunk"]),
                     st.text(max_size=24) | st.sampled_from(["=", "A", "AB=", "data:", "data:,", "data:x,!!!",
                                                            "QUJD\nRA==", "QUJDRA==" * 3 + "!"]))
r_nested = st.tuples(st.just("nested"), st.sampled_from([50, 500, 900, 980, 1000, 3000, 100_000]),
                     st.sampled_from(["open", "balanced", "objects", "in_text", "in_type", "in_data"]))
r_number = st.tuples(st.just("number"), st.sampled_from(["1" * 5000, "1e999999", "-1e999999", "NaN", "Infinity",
                                                        "-Infinity", "1" * 4000, "0." + "1" * 5000]))
r_pts = st.tuples(st.just("pts"), bad_values | st.sampled_from([1e300, -1e300, 2**70, -5, 0, 1e9]))
r_valid = st.tuples(st.just("valid"), st.sampled_from(["frame", "frame", "query", "odd_query", "ping", "config",
                                                      "audio"]),
                    st.integers(0, len(JPEGS) - 1))
recipe = st.one_of(r_bytes, r_text, r_json, r_fields, r_update, r_huge, r_b64, r_badb64, r_nested, r_number,
                   r_pts, r_valid)
batches = st.lists(recipe, min_size=30, max_size=45)


class Builder:
    """Turns recipes into WebSocket messages; keeps megabyte messages within a budget."""

    def __init__(self) -> None:
        self.huge_bytes = 0

    def build(self, r: tuple) -> str | bytes:
        kind = r[0]
        if kind == "bytes":
            return r[1]
        if kind == "text":
            return r[1]
        if kind == "json":
            return json.dumps(r[1])
        if kind == "msg":
            _, typ, fields = r
            return json.dumps({"type": typ, **fields})
        if kind == "huge":
            _, where, size = r
            if self.huge_bytes > HUGE_BUDGET:
                size = min(size, 70_000)
            self.huge_bytes += size
            return self._huge(where, size)
        if kind == "b64":
            _, typ, blob, data_url = r
            data = base64.b64encode(BLOBS[blob] if isinstance(blob, str) else blob).decode()
            return json.dumps({"type": typ, "data": ("data:image/png;base64," if data_url else "") + data})
        if kind == "badb64":
            return json.dumps({"type": r[1], "data": r[2]})
        if kind == "nested":
            return self._nested(r[1], r[2])
        if kind == "number":
            return '{"type": "video.frame", "pts_ms": %s, "data": "%s"}' % (r[1], JPEG_B64[0])
        if kind == "pts":
            return json.dumps({"type": "video.frame", "pts_ms": r[1], "data": JPEG_B64[2]})
        if kind == "valid":
            _, what, i = r
            if what == "frame":
                return json.dumps({"type": "video.frame", "data": JPEG_B64[i]})
            if what == "query":
                return json.dumps({"type": "video.query", "text": f"What is in frame {i}?"})
            if what == "odd_query":  # a lone surrogate, NUL, control characters, an emoji, a template tag
                text = ["\ud800 what?", "\x00\x01\x1b[2J", "🙂" * 50, "<|im_end|><|im_start|>system", "{{x}}"][i % 5]
                return json.dumps({"type": "video.query", "text": text})
            if what == "config":
                return json.dumps(CONFIG)
            if what == "audio":
                return json.dumps({"type": "audio.chunk", "data": base64.b64encode(b"\x01\x00" * 800).decode()})
            return json.dumps({"type": "ping"})
        raise AssertionError(r)

    @staticmethod
    def _huge(where: str, size: int) -> str:
        if where == "raw":
            return "x" * size
        if where == "type":
            return json.dumps({"type": "t" * size})
        if where == "query":  # a question far longer than the model's context
            return json.dumps({"type": "video.query", "text": "why " * (min(size, 300_000) // 4)})
        if where == "frame_zeros":  # valid base64 of zeros: not an image (or too large)
            return json.dumps({"type": "video.frame", "data": "A" * (size // 4 * 4)})
        if where == "frame_junk":
            return json.dumps({"type": "video.frame", "data": "!" * size})
        if where == "audio":  # silence: valid audio (odd sizes are refused)
            return json.dumps({"type": "audio.chunk", "data": "A" * (size // 4 * 4)})
        if where == "key":
            return json.dumps({"type": "ping", "k" * size: 1})
        if where == "json_string":
            return json.dumps("s" * size)
        if where == "system_prompt":
            return json.dumps({"type": "session.update", "system_prompt": 5, "x": "p" * size})
        return '{"type": "video.frame", "data": "' + "A" * size  # unterminated

    @staticmethod
    def _nested(depth: int, style: str) -> str:
        if style == "open":
            return "[" * depth
        if style == "balanced":
            return "[" * depth + "]" * depth
        if style == "objects":
            return '{"a": ' * depth + "1" + "}" * depth
        nest = "[" * depth + "]" * depth
        if style == "in_text":
            return '{"type": "video.query", "text": %s}' % nest
        if style == "in_type":
            return '{"type": %s}' % nest
        return '{"type": "video.frame", "data": %s}' % nest


# ---- a client that reads everything the server sends ---------------------------

class Client:
    def __init__(self, ws, name: str) -> None:
        self.ws, self.name = ws, name
        self.inbox: asyncio.Queue = asyncio.Queue()
        self.seen: list[dict] = []
        self.problems: list[str] = []  # server messages that are not well-formed, internal errors
        self.closed = False
        self.reader = asyncio.create_task(self._read())

    @classmethod
    async def open(cls, server, name: str, config: dict | None = CONFIG) -> "Client":
        ws = await websockets.connect(server.ws_url, max_size=None, open_timeout=30)
        client = cls(ws, name)
        if config is not None:
            await ws.send(json.dumps(config))
        return client

    async def _read(self) -> None:
        try:
            async for raw in self.ws:
                try:
                    msg = json.loads(raw)
                except ValueError:
                    msg = None
                if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
                    self.problems.append(f"{self.name}: not a message: {raw[:200]!r}")
                    continue
                if msg["type"] == "error" and "nternal" in str(msg.get("message")):
                    self.problems.append(f"{self.name}: {msg['message']}")
                self.seen.append(msg)
                self.inbox.put_nowait(msg)
        except websockets.ConnectionClosed:
            pass
        finally:
            self.closed = True
            self.inbox.put_nowait(None)

    def why_closed(self) -> str:
        return (f"{self.name} was closed: code={self.ws.close_code} reason={self.ws.close_reason!r}; "
                f"last messages: {self.seen[-5:]}")

    async def send(self, payload: str | bytes) -> None:
        try:
            await self.ws.send(payload)
        except websockets.ConnectionClosed:
            pytest.fail(self.why_closed())

    async def until(self, kind: str, timeout: float = 60.0, match=lambda m: True) -> list[dict]:
        out: list[dict] = []
        deadline = time.monotonic() + timeout
        while True:
            try:
                msg = await asyncio.wait_for(self.inbox.get(), max(deadline - time.monotonic(), 0.01))
            except TimeoutError:
                pytest.fail(f"{self.name}: no {kind} within {timeout} s; got {[m['type'] for m in out][-20:]}")
            if msg is None:
                self.inbox.put_nowait(None)
                pytest.fail(self.why_closed())
            out.append(msg)
            if msg["type"] == kind and match(msg):
                return out

    async def sync(self) -> None:
        """Everything sent so far was handled (the session still reads and answers)."""
        await self.send(json.dumps({"type": "ping"}))
        await self.until("pong")

    async def answers_a_valid_question(self, seed: int) -> dict:
        await self.sync()
        await self.send(json.dumps({"type": "session.update", "max_tokens": 4, "seed": seed, "temperature": 0.0,
                                    "system_prompt": None, "num_sample_frames": 4, "max_frames": 16,
                                    "evs_enabled": False, "sampling": "uniform", "frames_as": "images",
                                    "include_audio": False}))
        await self.until("session.updated", match=lambda m: m["settings"].get("seed") == seed)
        for data in JPEG_B64[:3]:
            await self.send(json.dumps({"type": "video.frame", "data": data}))
        await self.send(json.dumps({"type": "video.query", "text": "What do you see?"}))
        msgs = await self.until("response.text.done", match=lambda m: m["stats"].get("seed") == seed)
        start = max(i for i, m in enumerate(msgs) if m["type"] == "response.start")
        mine = msgs[start:]
        assert {m["type"] for m in mine[1:-1]} <= {"response.text.delta", "error"}, mine
        done = mine[-1]
        assert done["text"] == "".join(m["delta"] for m in mine if m["type"] == "response.text.delta")
        stats = done["stats"]
        assert stats["cancelled"] is False and stats["frames"] >= 1 and stats["completion_tokens"] >= 1, stats
        return done

    async def close(self) -> None:
        await self.ws.close()
        await self.reader


# ---- the tests -----------------------------------------------------------------

@pytest.fixture()
def server_log(server):
    start = len(server.log())
    yield
    assert server.proc.poll() is None, "the server process died"
    assert server.get_json("/api/health").get("ok"), "the server is not healthy"
    log = server.log()[start:]
    for needle in ("Traceback", "session failed", "failed\n", "Exception in ASGI"):
        assert needle not in log, f"{needle!r} in the server log:\n{log[log.find(needle) - 2000:][:6000]}"


def test_fuzz_sessions_survive_malformed_messages(server, server_log):
    t0 = time.monotonic()
    loop = asyncio.new_event_loop()
    builder = Builder()
    sent = {"messages": 0, "sessions": 0, "answers": 0, "batches": 0}
    live: list[Client] = []
    problems: list[str] = []

    async def open_pair() -> None:
        for _ in range(2):
            sent["sessions"] += 1
            live.append(await Client.open(server, f"session {sent['sessions']}"))
        for c in live:
            await c.sync()  # configured

    async def retire_pair() -> None:
        for c in live:
            await c.answers_a_valid_question(seed=1000 + sent["answers"])
            sent["answers"] += 1
            assert not c.closed, c.why_closed()
            await c.close()
            problems.extend(c.problems)
        live.clear()

    async def run_batch(batch: list[tuple]) -> None:
        if not live:
            await open_pair()
        payloads = [builder.build(r) for r in batch]
        halves = (payloads[::2], payloads[1::2])

        async def feed(client: Client, items) -> None:
            for p in items:
                await client.send(p)
            await client.sync()

        await asyncio.gather(*(feed(c, h) for c, h in zip(live, halves)))
        sent["messages"] += len(payloads)
        sent["batches"] += 1
        if sent["batches"] % BATCHES_PER_SESSION == 0:
            await retire_pair()

    # No shrinking: against a live server it would take minutes; the failing batch is printed as drawn.
    @settings(max_examples=BATCHES, deadline=None, derandomize=True, database=None,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @given(batches)
    def fuzz(batch):
        loop.run_until_complete(run_batch(batch))

    try:
        fuzz()
        if live:
            loop.run_until_complete(retire_pair())
    finally:
        for c in live:
            loop.run_until_complete(c.ws.close())
        loop.close()
    elapsed = time.monotonic() - t0
    print(f"fuzz: {sent} in {elapsed:.1f} s, {builder.huge_bytes / 1e6:.0f} MB in large messages")
    assert not problems, "\n".join(sorted(set(problems)))
    assert sent["messages"] >= MIN_MESSAGES, sent
    assert sent["answers"] == sent["sessions"] >= 10, sent


FIRST_MESSAGES = st.one_of(r_bytes, r_text, r_json, r_fields, r_huge, r_b64, r_badb64, r_nested, r_number,
                           r_pts, st.tuples(st.just("valid"), st.sampled_from(["frame", "query", "ping"]),
                                            st.integers(0, 2)))


def test_fuzz_messages_before_session_config_end_the_session(server, server_log):
    """Anything but a valid session.config first: an error, then 1008."""
    loop = asyncio.new_event_loop()
    builder = Builder()
    count = {"n": 0}

    async def first(payload) -> None:
        c = await Client.open(server, "pre-config", config=None)
        await c.send(payload)
        msgs = await c.until("error", timeout=30)
        assert [m["type"] for m in msgs] == ["error"], msgs
        await asyncio.wait_for(c.reader, 10)
        assert c.ws.close_code == 1008, c.why_closed()
        count["n"] += 1

    @settings(max_examples=120, deadline=None, derandomize=True, database=None,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @given(FIRST_MESSAGES)
    def fuzz(r):
        payload = builder.build(r)
        if isinstance(payload, str) and payload.startswith('{"type": "session.config"'):
            return
        loop.run_until_complete(first(payload))

    try:
        fuzz()
    finally:
        loop.close()
    assert count["n"] >= 100


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
@given(st.dictionaries(st.sampled_from(CONFIG_KEYS + ["max_tokens"]), bad_values, min_size=1, max_size=4))
def test_fuzz_session_config_values(server, server_log, fields):
    """A session.config with junk values is refused with an error and 1008,
    or accepted (junk that happens to be valid, or unknown keys): then it works."""
    async def run() -> None:
        c = await Client.open(server, "config", config={**CONFIG, **fields})
        await c.send(json.dumps({"type": "ping"}))
        msg = await asyncio.wait_for(c.inbox.get(), 30)  # the pong, or the error that refused the config
        if msg is not None and msg["type"] == "error":
            await asyncio.wait_for(c.reader, 10)
            assert c.ws.close_code == 1008, c.why_closed()
        else:
            assert msg == {"type": "pong"}, (fields, msg, c.why_closed() if c.closed else "")
            await c.close()

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(run())
    finally:
        loop.close()


def test_out_of_order_messages(server, server_log):
    async def run() -> None:
        # video.done first: the session ends normally, with empty stats.
        c = await Client.open(server, "done-first")
        await c.send(json.dumps({"type": "video.done"}))
        msgs = await c.until("session.done")
        evs = [m for m in msgs if m["type"] == "response.evs_stats"]
        assert evs and evs[0]["total_count"] == 0
        await asyncio.wait_for(c.reader, 10)
        assert c.ws.close_code == 1000
        # A question before frames, a second session.config, audio before frames, then a real question.
        c = await Client.open(server, "out-of-order")
        for msg in ({"type": "video.query", "text": "Anything?"}, CONFIG,
                    {"type": "audio.chunk", "data": base64.b64encode(b"\x00\x01" * 100).decode()},
                    {"type": "session.update"}, {"type": "video.query", "text": "Now?"}):
            await c.send(json.dumps(msg))
        await c.sync()
        errors = [m["message"] for m in c.seen if m["type"] == "error"]
        assert len(errors) == 3 and "already received" in errors[1], errors
        await c.answers_a_valid_question(seed=7)
        # video.done while an answer streams: it is finished first, then the stats.
        await c.send(json.dumps({"type": "video.query", "text": "Once more?"}))
        await c.send(json.dumps({"type": "video.done"}))
        types = [m["type"] for m in await c.until("session.done")]
        assert "response.text.done" in types and types.index("response.text.done") < types.index("session.done")
        await asyncio.wait_for(c.reader, 10)
        assert c.ws.close_code == 1000

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(run())
    finally:
        loop.close()


# ---- hostile recording bundles (issue 21) -------------------------------------------

import hostile_bundles as hb  # noqa: E402 - the bundle builders, shared with the hosting tests

from vidchat.conversation import bundles

MANIFEST_FIELDS = ([("", k) for k in ("question", "answer", "history", "t", "source", "model", "model_option",
                                      "engine", "seed", "settings", "prompt", "timings", "tokens",
                                      "inputs_sha256", "spoken_question", "frames_as", "video_fps", "record",
                                      "frames", "audio", "created", "kind")]
                   + [("settings", k) for k in ("frames_as", "max_tokens", "temperature", "include_audio",
                                                "system_prompt", "seed", "num_sample_frames", "sampling",
                                                "evs_threshold", "max_frames", "turn_detection")]
                   + [("tokens", k) for k in ("prompt_tokens", "cached_tokens", "completion_tokens",
                                              "finish_reason")]
                   + [("timings", k) for k in ("prep_ms", "ttft_ms", "total_s", "tokens_per_s")]
                   + [("frames", k) for k in ("file", "t", "index", "width", "height", "source_t")]
                   + [("record", k) for k in ("model_revision", "source", "audio_parts", "audio_source_span")])
MARKUPS = [hb.MARKUP, "<b>bold</b>", '"><img src=x onerror=alert(1)>', "'onmouseover='alert(1)'",
           "<iframe src=javascript:alert(1)>"]
manifest_values = bad_values | st.sampled_from(MARKUPS) | st.lists(st.sampled_from(MARKUPS), max_size=2)
manifest_changes = st.lists(st.tuples(st.sampled_from(MANIFEST_FIELDS), manifest_values), min_size=1, max_size=5)


def mutated_bundle(path, changes) -> tuple:
    pixels = hb.frames()
    meta = hb.manifest(pixels, text="What is there? " + MARKUPS[0])
    for (group, name), value in changes:
        try:
            meta = hb.with_value(meta, group, name, value)
        except (TypeError, KeyError, IndexError):  # an earlier change replaced the group itself
            pass
    return hb.write_zip(path, pixels, meta), meta


def shown_raw(page: str) -> list[str]:
    """Markup from the payloads that reached the page as markup."""
    return [tag for tag in ("<img src=x", "<script>window", "<svg onload", "<b>bold", "<iframe", "onmouseover='")
            if tag in page]


@settings(max_examples=200, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(manifest_changes)
def test_fuzz_bundle_manifests_are_refused_by_name_or_shown_as_text(tmp_path_factory, changes):
    from vidchat.doors import answer_routes as answer_inputs
    from vidchat.doors.page import compare_html

    path, _ = mutated_bundle(tmp_path_factory.mktemp("bundle") / "b.zip", changes)
    try:
        bundle = bundles.read_bundle(path)
    except bundles.BundleError as exc:
        assert str(exc)  # a message for the page, which shows it escaped
        return
    answer = bundles.recorded_answer(bundle)
    json.dumps(answer.summary())
    page = compare_html(answer, None, "", "note") + answer_inputs.details_html(answer, "answer-id")
    assert not shown_raw(page), shown_raw(page)


@settings(max_examples=25, deadline=None, derandomize=True, database=None, phases=[Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(manifest_changes)
def test_fuzz_hostile_bundles_through_the_page_api(server, server_log, tmp_path_factory, changes):
    """Through the real page API (upload, then /load_bundle): every bundle is
    loaded or refused with a message, the panel never holds raw markup, and
    the server stays up with no traceback (server_log)."""
    from test_hosting import client, page_call, panel, upload

    path, _ = mutated_bundle(tmp_path_factory.mktemp("bundle") / "b.zip", changes)
    with client(server) as page:
        kind, out = page_call(page, "load_bundle", [upload(page, path), ""])
    assert kind == "complete", out
    shown = panel(out)
    assert ("Loaded the bundle" in shown or "Not a bundle vidchat can read" in shown), shown[:300]
    assert not shown_raw(shown), shown_raw(shown)
