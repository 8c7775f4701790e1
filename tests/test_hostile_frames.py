"""Hostile frames and JSON (issue 10): only JPEG, PNG and WebP; width × height
checked from the header before any pixel is decoded; every decode failure a
FrameError; JSON nested too deeply is an ordinary parse error."""

from __future__ import annotations

import asyncio
import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from vidchat.app.settings import parse_settings
from vidchat.doors.socket import seed
from vidchat.media import DEFAULT_MAX_FRAME_PIXELS, evs
from vidchat.media.session import FrameError, Session

pytestmark = pytest.mark.unit


def encode(fmt: str, w: int = 64, h: int = 48, mode: str = "RGB", **kw) -> bytes:
    rng = np.random.default_rng(0)
    if mode == "I;16":
        img = Image.fromarray(rng.integers(0, 65536, (h, w), dtype=np.uint16))
    else:
        img = Image.fromarray(rng.integers(0, 256, (h, w, 3) if mode == "RGB" else (h, w), dtype=np.uint8))
    assert img.mode == mode
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_bomb(w: int, h: int) -> bytes:
    """A valid PNG header claiming w×h RGB, with (almost) no pixel data: ~70 bytes."""
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", zlib.compress(b"")) + _chunk(b"IEND", b"")


@pytest.mark.parametrize("fmt, name", [("GIF", "GIF"), ("BMP", "BMP"), ("TIFF", "TIFF"), ("ICO", "ICO")])
def test_other_formats_are_refused_naming_the_accepted_ones(fmt, name):
    data = encode(fmt)
    assert Image.open(io.BytesIO(data)).format == fmt  # PIL could read it; vidchat does not
    s = Session("s")
    with pytest.raises(FrameError) as err:
        s.add_jpeg(data)
    assert f"{name} images are not accepted" in str(err.value)
    assert "JPEG, PNG or WebP" in str(err.value)
    assert s.stats["frames_received"] == 0  # a refused frame leaves the session unchanged


def test_not_an_image_names_the_accepted_formats():
    for data in (b"plain text, not a picture", b"\x00" * 100, b"\xff\xd8"):
        with pytest.raises(FrameError, match="JPEG, PNG or WebP"):
            evs.open_image(data)


def test_tiny_png_claiming_a_huge_size_is_refused_by_its_header():
    data = png_bomb(30000, 30000)
    assert len(data) < 100
    s = Session("s")
    with pytest.raises(FrameError) as err:
        s.add_jpeg(data)
    assert str(err.value) == ("image is 30000x30000 = 900000000 pixels; "
                              f"the limit is {DEFAULT_MAX_FRAME_PIXELS} (--max-frame-pixels)")
    # Also with the filter off (the stored copy is opened on its own).
    s = Session("s", max_frame_pixels=1000)
    s.update_settings(evs_enabled=False)
    with pytest.raises(FrameError, match="the limit is 1000"):
        s.add_jpeg(png_bomb(40, 30))
    # PIL's own check would have said "decompression bomb": ours comes first at any size.
    with pytest.raises(FrameError, match=r"= 4000000000000 pixels"):
        evs.open_image(png_bomb(2_000_000, 2_000_000))


def test_the_limit_counts_width_times_height_and_is_per_session():
    jpeg = encode("JPEG", 64, 48)
    s = Session("s", max_frame_pixels=64 * 48)
    assert s.add_jpeg(jpeg)  # exactly at the limit
    s = Session("s", max_frame_pixels=64 * 48 - 1)
    with pytest.raises(FrameError, match="image is 64x48 = 3072 pixels; the limit is 3071"):
        s.add_jpeg(jpeg)
    with pytest.raises(ValueError, match="max_frame_pixels"):
        Session("s", max_frame_pixels=0)


@pytest.mark.parametrize("fmt, mode, kw", [
    ("JPEG", "RGB", {}),
    ("PNG", "RGB", {}),
    ("PNG", "L", {}),
    ("PNG", "I;16", {}),  # 16-bit grey: converted, never an uncaught error
    ("WEBP", "RGB", {"lossless": True}),
    ("WEBP", "RGB", {"quality": 80}),
])
def test_jpeg_png_and_webp_are_accepted(fmt, mode, kw):
    s = Session("s")
    s.update_settings(evs_enabled=False)
    assert s.add_jpeg(encode(fmt, 64, 48, mode, **kw))
    sample = s.sample()
    assert len(sample.frames) == 1 and sample.frames[0].shape == (48, 64, 3)
    grid = evs.thumbnail_from_bytes(encode(fmt, 64, 48, mode, **kw))
    assert grid.shape == (3, evs.GRID_ROWS, evs.GRID_COLS)


def test_broken_data_in_an_accepted_format_is_a_frame_error():
    s = Session("s")
    png = encode("PNG", 64, 48)
    webp = encode("WEBP", 64, 48)
    cases = [
        png[:40],  # header only, pixels cut off
        png[:60] + b"\x00" * 40 + png[100:],  # corrupt IDAT
        png[:8] + b"\x00" * 30,  # signature, then garbage
        webp[:30],
        b"RIFF\x00\x00\x00\x00WEBPVP8 " + b"\xff" * 30,
        b"\xff\xd8\xff" + b"\x00" * 50,
    ]
    for data in cases:
        with pytest.raises(FrameError):
            s.add_jpeg(data)
    assert s.stats["frames_received"] == 0 and s.sample().frames == []


def test_max_frame_pixels_setting():
    assert parse_settings([]).max_frame_pixels == 4096 * 4096 == DEFAULT_MAX_FRAME_PIXELS
    assert parse_settings(["--max-frame-pixels", "1000"]).max_frame_pixels == 1000


def test_max_frame_pixels_from_the_environment(monkeypatch):
    monkeypatch.setenv("VIDCHAT_MAX_FRAME_PIXELS", "2048")
    assert parse_settings([]).max_frame_pixels == 2048


@pytest.mark.parametrize("raw", ["[" * 100_000, '{"a": ' * 100_000, "[" * 100_000 + "]" * 100_000,
                                 '{"type": "video.frame", "data": ' + "[" * 200_000 + "}"])
def test_json_nested_too_deeply_is_a_value_error(raw):
    # Short messages are parsed inline, long ones (> 64 KiB) in a worker thread.
    with pytest.raises(ValueError, match="nested too deeply"):
        asyncio.run(seed.Connection._parse(None, raw))


@pytest.mark.parametrize("raw", ['{"type": "video.query", "text": "\\ud800 what?"}',
                                 '{"type": "\\udfff"}', '{"\\ud800": 1, "type": "ping"}',
                                 '{"type": "video.query", "text": "\\ud800' + "x" * 100_000 + '"}'])
def test_lone_surrogates_are_refused(raw):
    # Valid JSON syntax, but not text: it would break the tokenizer and the replies' UTF-8.
    with pytest.raises(ValueError, match="lone surrogate"):
        asyncio.run(seed.Connection._parse(None, raw))


def test_surrogate_pairs_and_other_text_are_parsed():
    raw = '{"type": "video.query", "text": "\\ud83d\\ude00 caf\\u00e9 \\u0000"}'  # how ensure_ascii encoders write 😀
    assert asyncio.run(seed.Connection._parse(None, raw)) == {"type": "video.query", "text": "😀 café \x00"}
    big = '{"type": "video.frame", "data": "' + "A" * 100_000 + '"}'
    msg = asyncio.run(seed.Connection._parse(None, big))
    assert msg["type"] == "video.frame" and len(msg["data"]) == 100_000
