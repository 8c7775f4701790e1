"""Facts about media that every module shares: the audio rate, how frames may
be handed to the model, and the size at which frames are stored.

Each of these used to be written down in several modules; one definition
here keeps the doors, the session and the engine agreeing.
"""

from __future__ import annotations

import math
from typing import Any

# The session's audio timeline, the engine's input and the WebSocket
# protocol's PCM16 chunks all run at 16 kHz mono (what Whisper-style audio
# encoders take).
AUDIO_RATE = 16_000

# Shorter audio fails a Whisper-style encoder (it needs several 10 ms frames):
# the engine drops such a sliver, and the audio's segments never end on one.
MIN_AUDIO_SAMPLES = AUDIO_RATE // 10

# A question's frames reach the model as separate images (each one an
# encoder-cache hit when it is sent again) or as one video (temporal
# compression, and the frames' spacing reaches the model's positions).
FRAMES_AS = ("images", "video")

# Frames are stored at no more than this many pixels unless the model is
# configured to look at more (about what a VLM's processor keeps of a webcam
# frame anyway; see Session for the memory arithmetic).
DEFAULT_STORE_MAX_PIXELS = 320 * 240


def reduce_factor(width: int, height: int, max_pixels: int | None) -> int:
    """The smallest whole factor that brings a frame within ``max_pixels``.

    Whole factors keep downscaling a cheap box filter (PIL's reduce, libjpeg's
    DCT scaling) and keep the aspect ratio exact."""
    if max_pixels is None or width * height <= max_pixels:
        return 1
    k = max(2, math.ceil(math.sqrt(width * height / max_pixels)))
    while math.ceil(width / k) * math.ceil(height / k) > max_pixels:
        k += 1
    return k


def stored_size(width: int, height: int, max_pixels: int | None) -> tuple[int, int]:
    """The (width, height) at which a frame of this size is kept and sent to the model."""
    k = reduce_factor(width, height, max_pixels)
    return math.ceil(width / k), math.ceil(height / k)


def describe_store_limit(max_pixels: int | None) -> str:
    """The stored-size rule in words, for the page."""
    if max_pixels is None:
        return "Frames are kept and sent at the size the camera delivers."
    w, h = stored_size(640, 480, max_pixels)
    return (f"Frames are kept and sent at up to {max_pixels:,} pixels "
            f"(a 640×480 camera frame is stored as {w}×{h}).")

# Largest encoded frame accepted (the seed protocol's cap); --ws-max-frame-bytes
# overrides it and the session enforces whatever the server was given.
DEFAULT_MAX_FRAME_BYTES = 10 * 1024 * 1024

# Largest decoded frame accepted, in pixels (width × height), checked from the
# image header before any pixel is decoded; --max-frame-pixels overrides it.
DEFAULT_MAX_FRAME_PIXELS = 4096 * 4096


# A value as a number, the way every door and setting checks one: a JSON
# true/false (a Python bool, which is an int) is never a number, and a number
# is finite. One definition for the settings table, the session's settings,
# the media clock, the doors' fields and Talk's settings.

def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """An int or a finite float, never a bool (math.isfinite is not asked
    of ints: it raises OverflowError for a huge JSON integer)."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))
