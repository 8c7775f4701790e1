"""The page's WebRTC requests read and checked (vidchat.doors.webrtc_routes
serves them): a JSON body, an offer (one video and one audio track at most;
a tab watching a stream may send only a data channel), and a report of where
its video source is."""

from __future__ import annotations

import collections
import json
import posixpath
from typing import Any

from fastapi import HTTPException, Request

from vidchat.media.clock import SENT_SOURCE_KINDS
from vidchat.media.numbers import is_number


async def read_json(request: Request) -> dict[str, Any]:
    # sendBeacon posts text/plain, so parse the body whatever its type says.
    try:
        body = json.loads(await request.body() or b"{}")
    except json.JSONDecodeError:
        raise HTTPException(400, "body must be JSON")
    if not isinstance(body, dict):
        raise HTTPException(400, "body must be a JSON object")
    return body



async def read_offer(request: Request) -> dict[str, Any]:
    body = await read_json(request)
    if body.get("type") != "offer" or not isinstance(body.get("sdp"), str):
        raise HTTPException(400, "expected {type: 'offer', sdp: '...'}")
    sections = [line.split(None, 1)[0][2:] for line in body["sdp"].splitlines() if line.startswith("m=") and " " in line]
    counts = collections.Counter(sections)
    stream = body.get("stream")
    if stream is not None and (not isinstance(stream, str) or not stream):
        raise HTTPException(400, "stream must be the name of one of the server's streams (GET /api/streams)")
    # A tab watching a stream may send no media of its own: a data channel keeps its connection.
    channels = counts["application"] if stream else 0
    if not counts["video"] and not counts["audio"] and not channels:
        raise HTTPException(400, "the offer carries no audio or video track")
    if counts["video"] > 1 or counts["audio"] > 1 or channels > 1 or \
            len(sections) > counts["video"] + counts["audio"] + channels:
        raise HTTPException(400, f"an offer may carry one video and one audio track; this one has "
                                 f"{', '.join(f'{n} {kind}' for kind, n in counts.items())}")
    return body


SOURCE_NAME_MAX = 200
SOURCE_RATE_MAX = 16.0  # browsers refuse playbackRate above 16




def parse_source_report(body: dict[str, Any]) -> dict[str, Any]:
    """A page's /webrtc/source report as :meth:`vidchat.media.session.Session.set_source`
    arguments; raises ValueError naming the first bad field."""
    sid = body.get("session_id")
    if not isinstance(sid, str) or not sid:
        raise ValueError("session_id must be the session's id (text)")
    kind = body.get("kind")
    if kind not in SENT_SOURCE_KINDS:
        raise ValueError(f"kind must be one of {', '.join(SENT_SOURCE_KINDS)}, got {kind!r}")
    out: dict[str, Any] = {"session_id": sid, "kind": kind}
    at = body.get("at")
    if at is not None:
        if not is_number(at) or at <= 0:
            raise ValueError(f"at must be the page's time in ms since the Unix epoch, or null, got {at!r}")
        out["at_sender_s"] = float(at) / 1000.0
    if kind != "file":
        return out
    name = body.get("name")
    if name is not None and not isinstance(name, str):
        raise ValueError(f"name must be the file's name (text) or null, got {type(name).__name__}")
    if name:
        # Only the base name: a path would say more about the viewer's disk than the record needs.
        name = posixpath.basename(name.replace("\\", "/")).strip()[:SOURCE_NAME_MAX] or None
    position = body.get("position")
    if not is_number(position) or position < 0:
        raise ValueError(f"position must be a number of seconds >= 0, got {position!r}")
    playing = body.get("playing", True)
    if not isinstance(playing, bool):
        raise ValueError(f"playing must be true or false, got {playing!r}")
    rate = body.get("rate", 1.0)
    if not is_number(rate) or not 0 < rate <= SOURCE_RATE_MAX:
        raise ValueError(f"rate must be a number in (0, {SOURCE_RATE_MAX:g}], got {rate!r}")
    duration = body.get("duration")
    if duration is not None and (not is_number(duration) or duration <= 0):
        raise ValueError(f"duration must be a positive number of seconds or null, got {duration!r}")
    loop = body.get("loop", False)
    if not isinstance(loop, bool):
        raise ValueError(f"loop must be true or false, got {loop!r}")
    out.update(name=name, position_s=float(position), playing=playing, rate=float(rate),
               duration_s=None if duration is None else float(duration), loop=loop)
    return out
