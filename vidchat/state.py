"""What the whole application shares: settings, the engine, the session
registry. Its own module so the doors (protocol, webrtc, ui) and the server
that assembles them all import it, and imports run one way."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vidchat.chat import AnswerOptions
from vidchat.engine import Engine
from vidchat.media import DEFAULT_STORE_MAX_PIXELS, describe_store_limit
from vidchat.models import TINY_BANNER
from vidchat.session import SessionSettings
from vidchat.sessions import Entry, SessionRegistry
from vidchat.settings import Settings


@dataclass
class AppState:
    settings: Settings
    model_path: str
    banner: str | None = None
    engine: Engine | None = None
    registry: SessionRegistry = field(default_factory=SessionRegistry)
    ice_servers: list[dict[str, Any]] = field(default_factory=list)

    @property
    def tiny(self) -> bool:
        """Running on the random-weight test model (resolve_model's banner says so)."""
        return self.banner is not None and self.banner.startswith(TINY_BANNER)

    def answer_defaults(self) -> AnswerOptions:
        s = self.settings
        return AnswerOptions(
            frames_as=s.frames_as,
            max_tokens=s.max_tokens,
            temperature=s.temperature,
            system_prompt=s.system_prompt or None,
        )

    def store_max_pixels(self) -> int:
        """Frames are kept at no more pixels than the model will look at (and
        at most 320x240 unless --max-image-pixels asks for more), which bounds
        a session's memory and the cost of preparing a question."""
        engine_cap = self.engine.options.max_image_pixels if self.engine else 0
        return self.settings.max_image_pixels or engine_cap or DEFAULT_STORE_MAX_PIXELS

    def store_limit_text(self) -> str:
        return describe_store_limit(self.store_max_pixels())

    def new_session(self, kind: str, **kwargs: Any) -> Entry:
        """Register a session with the server's storage size and frame cap (raises TooManySessions)."""
        return self.registry.create(kind, store_max_pixels=self.store_max_pixels(),
                                    max_frame_bytes=self.settings.ws_max_frame_bytes, **kwargs)


def default_session_settings(settings: Settings) -> SessionSettings:
    return SessionSettings(audio_seconds=settings.ws_max_audio_seconds,
                           num_sample_frames=settings.frames_per_question)
