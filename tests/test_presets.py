"""Presets: the table `--model list` prints, and how a preset fills in settings."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import ROOT

from vidchat.app import models
from vidchat.app.settings import Settings, parse_settings
from vidchat.engine import prompts

pytestmark = pytest.mark.unit

NAMES = ["qwen2.5-omni-3b", "qwen2.5-omni-7b", "qwen2.5-vl-3b", "qwen2.5-vl-7b", "qwen3-vl-4b",
         "smolvlm2-256m", "smolvlm2-2.2b"]


def test_the_promised_presets_exist_with_consistent_limits():
    assert set(NAMES) <= set(models.PRESETS)
    for name in NAMES:
        p = models.preset_named(name)
        s = models.apply_preset(Settings(), p)
        assert s.frames_per_question <= s.max_images, name
        assert (s.max_audios > 0) == p.audio, name
        family = prompts.BY_MODEL_TYPE[{"qwen2.5-omni": "qwen2_5_omni", "qwen2.5-vl": "qwen2_5_vl",
                                         "qwen3-vl": "qwen3_vl", "smolvlm": "smolvlm"}[p.family]]
        assert (family.video is None) == p.video.startswith("no"), name
        if family.video is None:
            assert s.frames_as == "images" and s.max_videos == 0, name


def test_a_flag_wins_over_the_preset():
    p = models.preset_named("smolvlm2-256m")
    chosen = models.apply_preset(parse_settings(["--max-images", "8", "--frames-per-question", "2"]), p)
    assert chosen.max_images == 8 and chosen.frames_per_question == 2
    assert chosen.max_videos == 0 and chosen.max_model_len == 8192  # left at defaults: the preset's


def test_the_cpu_presets_sample_stable_and_their_sessions_start_with_it():
    """Issue 49: on the SmolVLM presets (the CPU default) a question keeps
    its earlier picks and brings one new frame; the GPU presets keep
    'uniform'; --sampling wins over a preset like any flag."""
    from vidchat.app.state import default_session_settings

    for name in NAMES:
        chosen = models.apply_preset(Settings(), models.preset_named(name))
        assert chosen.sampling == ("stable" if name.startswith("smolvlm") else "uniform"), name
    cpu = models.apply_preset(Settings(), models.preset_named("smolvlm2-256m"))
    assert default_session_settings(cpu).sampling == "stable" and default_session_settings(cpu).num_sample_frames == 4
    assert models.apply_preset(parse_settings(["--sampling", "latest_frames"]), models.preset_named("smolvlm2-256m")).sampling \
        == "latest_frames"


def test_model_list_prints_every_preset_with_its_needs():
    out = subprocess.run([sys.executable, str(ROOT / "app.py"), "--model", "list"], capture_output=True,
                         text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    for name in NAMES:
        line = next(line for line in out.stdout.splitlines() if line.startswith(name + " "))
        p = models.preset_named(name)
        assert p.model in line and p.where in line and ("yes" if p.audio else "no") in line
        assert line.rstrip().endswith(str(p.frames_per_question))
    assert "runs on" in out.stdout and "needs" in out.stdout and "frames/question" in out.stdout


def test_family_rules():
    smol = prompts.family_of("smolvlm")
    assert smol.processor_kwargs(76800) == {"do_image_splitting": False}  # an edge length there, not pixels
    qwen = prompts.family_of("qwen2_5_vl")
    assert qwen.processor_kwargs(76800) == {"size": {"shortest_edge": 3136, "longest_edge": 76800}}
    import numpy as np

    video, meta = qwen.video_item(np.zeros((4, 8, 8, 3), np.uint8), 2.5)
    assert meta == {"fps": 2.5, "duration": 1.6, "total_num_frames": 4, "frames_indices": [0, 1, 2, 3],
                    "do_sample_frames": False}
    assert prompts.family_of("qwen2_5_omni_thinker").video_item(video, 2.5) is video
