"""WebRTC door (placeholder until the live-page work lands)."""
from __future__ import annotations

from fastapi import APIRouter


def router(state) -> APIRouter:
    return APIRouter()
