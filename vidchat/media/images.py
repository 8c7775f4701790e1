"""Frames as images: what a frame may be (an RGB array, a PIL image, or
JPEG/PNG/WebP bytes), checked before anything is decoded, and decoded with
every failure said as a FrameError. The EVS filter and the session buffer
read frames through this module; hostile input meets only these checks.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, JpegImagePlugin, PngImagePlugin, WebPImagePlugin  # noqa: F401 (registers the openers)

from vidchat.media import DEFAULT_MAX_FRAME_PIXELS


class FrameError(ValueError):
    """A frame that is not a usable image (wrong type, shape, dtype, empty, undecodable)."""


def as_rgb_array(frame: np.ndarray | Image.Image) -> np.ndarray:
    """Return ``frame`` as an H×W×3 uint8 array (no copy for valid arrays)."""
    if isinstance(frame, Image.Image):
        if frame.width == 0 or frame.height == 0:
            raise FrameError("empty image (0 pixels)")
        try:
            return np.asarray(frame if frame.mode == "RGB" else frame.convert("RGB"))
        except Exception as exc:  # a lazily opened image decodes here
            raise FrameError(f"image could not be read: {exc}") from exc
    if not isinstance(frame, np.ndarray):
        raise FrameError(f"frame must be an H×W×3 uint8 array, a PIL image or image bytes, "
                         f"got {type(frame).__name__}")
    if frame.ndim != 3 or frame.shape[2] != 3:
        raise FrameError(f"frame must have shape H×W×3 (RGB), got {frame.shape}")
    if frame.dtype != np.uint8:
        raise FrameError(f"frame must be uint8, got {frame.dtype}")
    if frame.shape[0] == 0 or frame.shape[1] == 0:
        raise FrameError(f"empty frame {frame.shape}")
    return frame


# Encoded frames must be one of these; other formats are refused before any
# other parser sees the bytes (fewer decoders exposed to hostile input).
ACCEPTED_FORMATS = ("JPEG", "PNG", "WEBP")
ACCEPTED_NAMES = "JPEG, PNG or WebP"
# Only to name a refused format in the error message (never opened).
_OTHER_SIGNATURES = ((b"GIF87a", "GIF"), (b"GIF89a", "GIF"), (b"BM", "BMP"), (b"II*\x00", "TIFF"),
                     (b"MM\x00*", "TIFF"), (b"\x00\x00\x01\x00", "ICO"), (b"8BPS", "PSD"))


def _refused_format(prefix: bytes) -> FrameError:
    name = next((n for sig, n in _OTHER_SIGNATURES if prefix.startswith(sig)), None)
    if name is None and prefix[4:8] == b"ftyp":
        name = "HEIF/AVIF"
    what = f"{name} images are" if name else "this data is"
    return FrameError(f"{what} not accepted: send a {ACCEPTED_NAMES} image")


def open_image(data: bytes | bytearray | memoryview, max_pixels: int = DEFAULT_MAX_FRAME_PIXELS) -> Image.Image:
    """Open encoded image bytes lazily (header only); raise FrameError if unusable.

    Only JPEG, PNG and WebP are accepted, and width × height must not exceed
    ``max_pixels``: both are checked from the header, before a pixel is
    decoded, so a small file that would decode to a huge image costs
    microseconds. (PIL's own decompression-bomb check is replaced by this one,
    which is stricter by default and names the server's setting.)"""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise FrameError(f"image data must be bytes, got {type(data).__name__}")
    if len(data) == 0:
        raise FrameError("empty image data")
    fp = io.BytesIO(bytes(data))
    prefix = fp.read(16)
    img: Image.Image | None = None
    for fmt in ACCEPTED_FORMATS:
        # Image.open's own loop, restricted to the accepted formats and
        # without its bomb check (which would refuse with PIL's message).
        factory, accept = Image.OPEN[fmt]
        verdict = accept(prefix) if accept is not None else True  # no check: any prefix (as PIL's loop)
        if isinstance(verdict, str):  # the format's decoder is missing from this PIL build
            raise FrameError(f"{fmt} images cannot be read by this server: {verdict}")
        if not verdict:
            continue
        fp.seek(0)
        try:
            img = factory(fp, "")
        except Exception as exc:  # SyntaxError, OSError, struct.error, ...: a broken header
            raise FrameError(f"not a decodable {fmt} image: {exc}") from exc
        break
    if img is None:
        raise _refused_format(prefix)
    width, height = img.size
    if width <= 0 or height <= 0:
        raise FrameError("empty image (0 pixels)")
    if width * height > max_pixels:
        raise FrameError(f"image is {width}x{height} = {width * height} pixels; "
                         f"the limit is {max_pixels} (--max-frame-pixels)")
    return img


def load_image(img: Image.Image) -> None:
    """Decode ``img`` now, turning truncated/corrupt data into FrameError."""
    try:
        img.load()
    except Exception as exc:  # OSError, ValueError, SyntaxError, EOFError, MemoryError, ...
        raise FrameError(f"image could not be decoded: {exc}") from exc


def to_rgb(img: Image.Image) -> Image.Image:
    """``img`` in RGB (decoding it if needed), FrameError if that fails."""
    if img.mode == "RGB":
        return img
    try:
        return img.convert("RGB")
    except Exception as exc:
        raise FrameError(f"image could not be converted to RGB: {exc}") from exc
