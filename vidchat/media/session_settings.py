"""The session's half of the settings table: how a session keeps and samples
frames and audio (SessionSettings), each field with its rule. The answer's
half, and the table every door reads, is vidchat.conversation.settings_table.
"""

from __future__ import annotations

from dataclasses import dataclass

from vidchat.media import evs
from vidchat.media.numbers import is_number
from vidchat.media.setting import Setting

MAX_FRAMES_LIMIT = 1024  # frames a session may keep, and sample for one question
SAMPLING_STRATEGIES = ("uniform", "stable", "latest_frames", "latest_seconds")
# What the page shows for each strategy (its value stays the name above, which
# every door and the protocol use), and what it does, shown while it is chosen.
SAMPLING_CHOICES = (
    ("uniform", "Spread over all kept frames",
     "Frames spread evenly over everything kept, oldest to newest."),
    ("stable", "Spread, reusing the last picks",
     "Spread over everything kept like the first choice, but a new frame changes only the newest pick, "
     "so questions share their prompt's start and answer sooner."),
    ("latest_frames", "The newest frames", "The newest kept frames, one after another."),
    ("latest_seconds", "Spread over the last seconds",
     "Frames spread over the last seconds set below (and the frame on screen as they began)."),
)
AUDIO_MODES = ("frames", "last")
MAX_AUDIO_SECONDS = 600.0

SESSION_SETTINGS: dict[str, Setting] = {s.name: s for s in (
    Setting("max_frames", "session", "int", "Max frames kept", f"an integer in 1..{MAX_FRAMES_LIMIT}",
            origin="seed", low=1, high=MAX_FRAMES_LIMIT),
    Setting("num_sample_frames", "session", "int", "Frames per question", f"an integer in 1..{MAX_FRAMES_LIMIT}",
            origin="seed", low=1, high=MAX_FRAMES_LIMIT, aliases=("num_frames",)),
    Setting("evs_enabled", "session", "bool", "Drop near-duplicate frames", "true or false", origin="seed",
            aliases=("enable_frame_filter",)),
    Setting("evs_threshold", "session", "number", "Filter threshold", "a number in [0, 1]", origin="seed",
            low=0.0, high=1.0, aliases=("frame_filter_threshold",)),
    Setting("sampling", "session", "choice", "Sampling", "one of " + ", ".join(SAMPLING_STRATEGIES),
            choices=SAMPLING_STRATEGIES, choice_labels=SAMPLING_CHOICES),
    Setting("sample_seconds", "session", "number", "Window of the last seconds", "a positive number",
            low=0.0, low_open=True),
    Setting("keepalive_s", "session", "number", "Keep-alive", "null or a positive number of seconds",
            low=0.0, low_open=True, nullable=True),
    Setting("audio_mode", "session", "choice", "Audio", "one of " + ", ".join(AUDIO_MODES), choices=AUDIO_MODES),
    Setting("audio_last_seconds", "session", "number", "Audio seconds", "a positive number",
            low=0.0, low_open=True),
)}


@dataclass
class SessionSettings:
    """Per-session options; may be changed between questions."""

    max_frames: int = 64
    num_sample_frames: int = 16
    sampling: str = "uniform"  # "uniform" | "stable" | "latest_frames" | "latest_seconds"
    sample_seconds: float = 10.0  # window for "latest_seconds"
    evs_enabled: bool = True
    evs_threshold: float = evs.DEFAULT_THRESHOLD  # keep a frame when > (1 - x) of the picture changed
    keepalive_s: float | None = None  # keep >= 1 frame every N seconds even if nothing changes
    audio_seconds: float = 30.0  # audio window cap
    audio_mode: str = "frames"  # "frames": from the first sampled frame on; "last": last audio_last_seconds
    audio_last_seconds: float = 10.0

    def validate(self) -> None:
        """Raise ValueError naming the first bad field (the rows above)."""
        for setting in SESSION_SETTINGS.values():
            setting.check(getattr(self, setting.name))
        if not is_number(self.audio_seconds) or not 0 < self.audio_seconds <= MAX_AUDIO_SECONDS:
            raise ValueError(f"audio_seconds must be a number in (0, {MAX_AUDIO_SECONDS:g}], "
                             f"got {self.audio_seconds!r}")
