"""A decoded video frame (PyAV) offered to a session, the one rule for
every live source that decodes video on the server: the WebRTC door's
camera and screen tracks, and the streams of --stream (vidchat.media.streams)."""

from __future__ import annotations

from typing import Any

import av
import numpy as np

# Decoder outputs with 8-bit luma at full size first, then U and V (NV12: interleaved).
LUMA_FIRST_FORMATS = frozenset({"yuv420p", "yuvj420p", "nv12", "yuv422p", "yuv444p"})


def yuv_planes(frame: av.VideoFrame) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """Views of a planar or NV12 frame's Y plane and its U and V planes (no copy)."""
    def plane(i: int, width_bytes: int) -> np.ndarray:
        p = frame.planes[i]
        return np.frombuffer(p, np.uint8).reshape(p.height, p.line_size)[:, :width_bytes]

    luma = plane(0, frame.width)
    if len(frame.planes) == 2:  # NV12: U and V interleaved in one plane
        uv = plane(1, 2 * frame.planes[1].width)
        return luma, (uv[:, 0::2], uv[:, 1::2])
    return luma, (plane(1, frame.planes[1].width), plane(2, frame.planes[2].width))


def render_rgb(frame: av.VideoFrame, width: int, height: int) -> np.ndarray:
    """The frame as RGB at ``width`` × ``height``."""
    if (width, height) == (frame.width, frame.height):
        return frame.to_ndarray(format="rgb24")
    # Area averaging: the downscale stays free of aliasing for the model.
    return frame.reformat(width=width, height=height, format="rgb24", interpolation="AREA").to_ndarray()


def offer_decoded(session: Any, frame: av.VideoFrame, t: float) -> bool:
    """Offer a decoded frame captured at ``t`` to ``session``'s filter and
    buffer; True if kept (raises FrameError for an unusable one). The filter
    reads the Y, U and V planes in place: most frames are dropped and never
    pay for conversion to RGB, which runs at the stored size for a kept one."""
    if frame.format.name in LUMA_FIRST_FORMATS:
        luma, chroma = yuv_planes(frame)
        return session.add_luma_frame(luma, lambda w, h: render_rgb(frame, w, h), t=t, chroma=chroma)
    return session.add_frame(frame.to_ndarray(format="rgb24"), t=t)
