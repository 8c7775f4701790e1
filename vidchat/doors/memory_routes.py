"""A session's memory over HTTP, for the login that opened the session:
``GET /sessions/<id>/memory`` (the scene log as JSON: each keyframe's
times, caption and thumbnail URL), ``GET /sessions/<id>/memory/<seq>.jpg``
(a keyframe's thumbnail; ``?full=1`` the frame as the model gets it) and
``POST /sessions/<id>/memory/pin {"seq": N}`` (the page's timeline: the
session's next question gets that keyframe; ``{"seq": null}`` unpins).

The log itself is vidchat.media.scene_log; what questions get of it is
vidchat.conversation.memory. Another login, or a session that ended, gets 404.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse, Response

from vidchat.conversation.events import SettingsChanged
from vidchat.doors import Server, login_of
from vidchat.doors.answer_routes import json_body

if TYPE_CHECKING:
    from vidchat.conversation.conversation import Conversation


def memory_json(entry: Conversation) -> dict[str, Any]:
    """The session's memory as GET /sessions/<id>/memory returns it."""
    session = entry.session
    body = session.scene_log.as_json(session.timeline_start, session.newest_frame_time)
    sid = session.id
    for frame in body["keyframes"]:
        frame["thumbnail"] = f"/sessions/{sid}/memory/{frame['seq']}.jpg"
    return {"session_id": sid, "memory": session.settings.memory, "pinned": entry.memory_pin, **body}


def router(state: Server) -> APIRouter:
    api = APIRouter()

    def owned(request: Request, sid: str) -> Conversation:
        entry = state.registry.get_for(sid, login_of(request.headers))
        if entry is None:
            raise HTTPException(404, "no such session (it ended, or another login opened it)")
        return entry

    @api.get("/sessions/{sid}/memory")
    async def memory(request: Request, sid: str) -> JSONResponse:
        return JSONResponse(memory_json(owned(request, sid)), headers={"Cache-Control": "no-store"})

    @api.get("/sessions/{sid}/memory/{seq}.jpg")
    async def keyframe(request: Request, sid: str, seq: int, full: bool = False) -> Response:
        frame = owned(request, sid).session.scene_log.get(seq)
        if frame is None:
            raise HTTPException(404, "no such keyframe (the log thinned it, or it never was one)")
        return Response(frame.jpeg if full else frame.thumbnail(), media_type="image/jpeg",
                        headers={"Cache-Control": "private, max-age=3600"})

    @api.post("/sessions/{sid}/memory")
    async def switch(request: Request, sid: str) -> dict[str, Any]:
        """{"memory": true|false}: the session's memory on or off (the page's switch; the
        socket doors set it in session.config/update)."""
        entry = owned(request, sid)
        body = await json_body(request, '{"memory": true | false}')
        on = body.get("memory")
        if not isinstance(on, bool):
            raise HTTPException(400, f"memory must be true or false, got {on!r}")
        entry.session.update_settings(memory=on)
        entry.event_hub.publish(SettingsChanged({"memory": on}))
        return memory_json(entry)

    @api.post("/sessions/{sid}/memory/pin")
    async def pin(request: Request, sid: str) -> dict[str, Any]:
        entry = owned(request, sid)
        body = await json_body(request, '{"seq": N | null}')
        if "seq" not in body:
            raise HTTPException(400, "send {\"seq\": N} to pin a keyframe, or {\"seq\": null} to unpin")
        seq = body["seq"]
        if seq is not None and (not isinstance(seq, int) or isinstance(seq, bool)
                                or entry.session.scene_log.get(seq) is None):
            raise HTTPException(400, f"seq must be a keyframe of this session's memory or null, got {seq!r}")
        entry.memory_pin = seq
        return {"pinned": seq}

    return api

