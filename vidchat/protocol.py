"""Seed WebSocket protocol (placeholder)."""
from __future__ import annotations


async def serve(state, websocket) -> None:
    await websocket.close()
