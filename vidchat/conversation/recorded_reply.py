"""A recorded answer as a reply (vidchat.engine.Reply): what the compare view
and re-asks read of a bundle's answer, with nothing left to generate."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from vidchat.engine import ReplyStats


class RecordedReply:
    """A bundle's answer as the page's compare view reads a live reply: its
    text, its stats and the model that gave it (nothing to generate or cancel)."""

    def __init__(self, manifest: dict[str, Any]):
        self.text = manifest.get("answer") or ""
        timings = manifest.get("timings") or {}
        tokens = manifest.get("tokens") or {}
        record = manifest.get("record") or {}
        ttft_ms = timings.get("ttft_ms")
        self.stats = ReplyStats(
            prompt_tokens=tokens.get("prompt_tokens") or 0,
            cached_tokens=tokens.get("cached_tokens") or 0,
            completion_tokens=tokens.get("completion_tokens") or 0,
            frames=len(manifest.get("frames") or []),
            audio_seconds=float((manifest.get("audio") or {}).get("seconds") or 0.0),
            ttft_s=None if ttft_ms is None else ttft_ms / 1000,
            tokens_per_s=timings.get("tokens_per_s"),
            total_s=timings.get("total_s") or 0.0,
            finish_reason=tokens.get("finish_reason"),
            inputs_sha256=manifest.get("inputs_sha256", ""),
        )
        self.engine = SimpleNamespace(model_path=manifest.get("model") or "",
                                      model_revision=manifest.get("model_revision") or record.get("model_revision")
                                      or "",
                                      # The engine that answered ("main" or "compare"), as recorded.
                                      options=SimpleNamespace(role=(manifest.get("engine") or {}).get("role")
                                                              or record.get("engine") or "main"))

    def __aiter__(self) -> "RecordedReply":
        return self

    async def __anext__(self) -> str:
        raise StopAsyncIteration  # recorded whole: nothing left to stream

    async def aclose(self) -> None:
        return None  # nothing runs
