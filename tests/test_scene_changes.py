"""Scene changes (what Watch asks at) include motion (issue 59, point 7): a
hand-sized object crossing the frame is one, though each step changes
little; a still scene with camera noise, a change of the lighting as a
whole, or a small object fidgeting in place are not. The share is the
session's ``scene_change_share`` (one row of the settings table)."""

from __future__ import annotations

import numpy as np
import pytest

from vidchat.conversation.asking import SETTINGS
from vidchat.media.frame_buffer import DEFAULT_SCENE_CHANGE_SHARE
from vidchat.media.session import Session, SessionSettings

pytestmark = pytest.mark.unit

W, H, FPS = 320, 240, 15
RNG = np.random.default_rng(7)
# A room: a soft gradient with some texture, as a webcam sees a wall and a desk.
ROOM = (np.linspace(70, 150, W)[None, :, None] + np.linspace(0, 40, H)[:, None, None]
        + RNG.integers(-12, 13, (H, W, 1))).repeat(3, axis=2)
HAND = np.array([205, 150, 120])  # skin-coloured, 64×80 px: a hand at arm's length (6.7 % of the picture)


def frame(hand_x: int | None = None, hand_y: int = 80, gain: float = 1.0, shift: float = 0.0) -> np.ndarray:
    pixels = ROOM * gain + shift + RNG.normal(0, 2.5, (H, W, 3))  # sensor noise
    if hand_x is not None:
        x0, x1 = max(0, hand_x), min(W, hand_x + 64)
        if x1 > x0:
            pixels[hand_y:hand_y + 80, x0:x1] = HAND + RNG.normal(0, 2.5, (80, x1 - x0, 3))
    return np.clip(pixels, 0, 255).astype(np.uint8)


def play(session: Session, frames: list[np.ndarray], start: float = 0.0) -> float:
    t = start
    for f in frames:
        session.add_frame(f, t=t)
        t += 1 / FPS
    return t


def test_a_hand_crossing_the_frame_is_a_scene_change():
    session = Session("watch", SessionSettings())
    t = play(session, [frame() for _ in range(FPS * 2)])  # still
    assert session.scene_changes == 0
    play(session, [frame(hand_x=x) for x in range(-64, W, 12)], t)  # across in about 2 s
    assert session.scene_changes >= 1


def test_a_still_scene_the_lighting_or_a_fidget_are_not():
    session = Session("watch", SessionSettings())
    t = play(session, [frame() for _ in range(FPS * 10)])  # ten still seconds with sensor noise
    t = play(session, [frame(gain=1.15, shift=8.0) for _ in range(FPS * 2)], t)  # a lamp switched on
    assert session.scene_changes == 0
    # A hand comes into view and rests there (one change at most: it came), then
    # moves a few pixels back and forth for ten seconds: that adds none.
    t = play(session, [frame(hand_x=120) for _ in range(FPS * 2)], t)
    came = session.scene_changes
    assert came <= 1
    play(session, [frame(hand_x=120 + (4 if i % 2 else -4), hand_y=80 + (i % 3)) for i in range(FPS * 10)], t)
    assert session.scene_changes == came


def test_the_share_is_a_session_setting_at_every_door():
    row = SETTINGS["scene_change_share"]
    assert row.target == "session" and SessionSettings().scene_change_share == DEFAULT_SCENE_CHANGE_SHARE
    less_sensitive = Session("watch", SessionSettings(scene_change_share=0.6))
    t = play(less_sensitive, [frame() for _ in range(FPS)])
    play(less_sensitive, [frame(hand_x=x) for x in range(-64, W, 12)], t)
    assert less_sensitive.scene_changes == 0  # a crossing hand is not 60 % of the picture
    with pytest.raises(ValueError, match="scene_change_share"):
        less_sensitive.update_settings(scene_change_share=0)
    less_sensitive.update_settings(scene_change_share=0.05)
    assert less_sensitive.settings.scene_change_share == 0.05
