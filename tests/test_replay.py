"""Headless replay (python -m vidchat.replay) and recording bundles.

Three CLI runs through real vLLM on the tiny omni model (each starts its own
engine): a generated clip replayed twice, once with --out, must send the
engine the same frames and audio (same frame_times, inputs_sha256) and give
the same answers at temperature 0; the bundles written read back to arrays
with the recorded hash; a bundle and a zipped bundle re-asked as a video give
the same inputs_sha256, and the same run replays a clip with hard cuts in
watch mode (--watch): one watch answer per cut. The rest (bundle format,
usage errors, the media schedule, when watch mode asks: at cuts, never on a
still scene) runs without an engine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
import wave
from pathlib import Path

import numpy as np
import pytest
from conftest import CACHE_DIR, ROOT, TEST_MAX_IMAGES, TEST_MAX_MODEL_LEN

from vidchat.conversation import bundles
from vidchat.conversation.answers import Answer, AnswerOptions
from vidchat.engine import EngineOptions, ReplyStats, Turn, inputs_digest
from vidchat.media import AUDIO_RATE
from vidchat.media.session import Session

CLIP_SECONDS = 4.0
CLIP_FPS = 10
ENGINE_ARGS = ["--cache-dir", str(CACHE_DIR), "--max-model-len", str(TEST_MAX_MODEL_LEN), "--kv-cache-gb", "0.25",
               "--max-images", str(TEST_MAX_IMAGES)]
QUESTIONS = ["--ask", "0:Too early?", "--ask", "1.5:What moves?", "--every", "2", "And now?",
             "--set", "temperature=0", "--set", "max_tokens=8", "--json"]


def moving_box(i: int, n: int, h: int, w: int) -> np.ndarray:
    img = np.full((h, w, 3), (30, 40, 90), np.uint8)
    x = int(i * (w - 60) / (n - 1))
    img[h // 3: h // 3 + 80, x: x + 60] = (230, 180, 40)
    return img


# Watch mode's clips: solid colours far apart in brightness (the filter forgives
# lighting changes up to ±40 grey levels), a hard cut every CUT_S seconds ...
CUT_S, CUT_COLOURS = 1.5, [(200, 30, 30), (250, 250, 250), (10, 10, 10), (240, 220, 40)]
CUTS_SECONDS = CUT_S * len(CUT_COLOURS)
CUTS = [CUT_S * k for k in range(1, len(CUT_COLOURS))]


def hard_cuts(i: int, n: int, h: int, w: int) -> np.ndarray:
    return np.full((h, w, 3), CUT_COLOURS[i // round(CUT_S * CLIP_FPS)], np.uint8)


def still_with_noise(i: int, n: int, h: int, w: int) -> np.ndarray:
    """... and one still scene with sensor-like noise on every pixel."""
    noise = np.random.default_rng(i).integers(-12, 13, (h, w, 3))
    return np.clip(np.array((60, 120, 90)) + noise, 0, 255).astype(np.uint8)


def make_clip(path: Path, seconds: float = CLIP_SECONDS, fps: int = CLIP_FPS, size=(320, 240),
              picture=moving_box, tone: bool = True) -> Path:
    """Frames from picture(i, n, h, w) (default: a box moving across a still background), with a
    440 Hz stereo tone at 44.1 kHz (resampled by replay) unless tone is False."""
    import av

    w, h = size
    with av.open(str(path), "w") as out:
        video = out.add_stream("mpeg4", rate=fps)
        video.width, video.height, video.pix_fmt = w, h, "yuv420p"
        if tone:
            audio = out.add_stream("aac", rate=44100)
            audio.layout = "stereo"
        n = int(seconds * fps)
        for i in range(n):
            out.mux(video.encode(av.VideoFrame.from_ndarray(picture(i, n, h, w), format="rgb24")))
        out.mux(video.encode())
        if not tone:
            return path
        rate = 44100
        for start in range(0, int(seconds * rate), 1024):
            k = np.arange(start, min(start + 1024, int(seconds * rate)))
            sine = (0.2 * np.sin(2 * np.pi * 440 * k / rate)).astype(np.float32)
            frame = av.AudioFrame.from_ndarray(np.stack([sine, sine]), format="fltp", layout="stereo")
            frame.sample_rate, frame.pts = rate, start
            out.mux(audio.encode(frame))
        out.mux(audio.encode())
    return path


def replay_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VIDCHAT_RECORD_DIR", "VIDCHAT_MODEL")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def replay(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vidchat.replay", *args], cwd=cwd, env=replay_env(),
                          capture_output=True, text=True, timeout=timeout)


def json_lines(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def listing(*dirs: Path) -> set[str]:
    return {str(p) for d in dirs for p in d.rglob("*")}


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("media")
    make_clip(d / "clip.mp4")
    return d


@pytest.fixture(scope="module")
def watch_clips(tmp_path_factory) -> types.SimpleNamespace:
    d = tmp_path_factory.mktemp("watch_media")
    return types.SimpleNamespace(cuts=make_clip(d / "cuts.mp4", CUTS_SECONDS, picture=hard_cuts),
                                 still=make_clip(d / "still.mp4", CUTS_SECONDS, picture=still_with_noise))


@pytest.fixture(scope="module")
def run_with_out(clip_dir, tmp_path_factory, tiny_omni_path):
    """First replay, writing bundles."""
    cwd = tmp_path_factory.mktemp("cwd_a")
    out = tmp_path_factory.mktemp("bundles") / "out"
    res = replay(str(clip_dir / "clip.mp4"), "--model", "tiny", *ENGINE_ARGS, *QUESTIONS, "--out", str(out),
                 cwd=cwd)
    return types.SimpleNamespace(res=res, lines=json_lines(res.stdout), out=out, cwd=cwd)


@pytest.fixture(scope="module")
def run_plain(clip_dir, tmp_path_factory, run_with_out):
    """Second replay, same file and settings, no --out: records what the folders held before and after."""
    cwd = tmp_path_factory.mktemp("cwd_b")
    before = listing(clip_dir, cwd)
    res = replay(str(clip_dir / "clip.mp4"), "--model", "tiny", *ENGINE_ARGS, *QUESTIONS, cwd=cwd)
    return types.SimpleNamespace(res=res, lines=json_lines(res.stdout), before=before,
                                 after=listing(clip_dir, cwd), cwd=cwd)


def answers(lines: list[dict]) -> list[dict]:
    return [r for r in lines if "error" not in r]


# ---------------------------------------------------------------------------
# Replay through real vLLM
# ---------------------------------------------------------------------------

@pytest.mark.engine
def test_replay_twice_sends_the_same_inputs_and_gets_the_same_answers(run_with_out, run_plain):
    for run in (run_with_out, run_plain):
        # The question at 0 s comes before any frame: it fails, the others are still answered.
        assert run.res.returncode == 1, run.res.stderr[-3000:]
        assert "no video frame before 0 s" in run.res.stderr
        errors = [r for r in run.lines if "error" in r]
        assert [(r["t"], r["question"]) for r in errors] == [(0.0, "Too early?")]
    a, b = answers(run_with_out.lines), answers(run_plain.lines)
    # 1.5 (--ask), then 2 and 4 (--every 2; the clip ends at 4 s)
    assert [r["t"] for r in a] == [1.5, 2.0, 4.0]
    assert [r["question"] for r in a] == ["What moves?", "And now?", "And now?"]
    keys = ("t", "question", "frame_times", "frame_indices", "audio_span", "audio_seconds", "inputs_sha256",
            "prompt_tokens", "prompt", "answer", "settings")
    for ra, rb in zip(a, b, strict=True):
        # Each answer draws its own seed (and records it); at temperature 0 it changes nothing else.
        unseeded = [{**r, "settings": {k: v for k, v in r["settings"].items() if k != "seed"}} for r in (ra, rb)]
        assert {k: unseeded[0][k] for k in keys} == {k: unseeded[1][k] for k in keys}
        assert isinstance(ra["seed"], int) and ra["settings"]["seed"] == ra["seed"]
    for r in a:
        times = r["frame_times"]
        # Seconds of the file: frames are at multiples of 1/10 s, all before the question's second.
        assert times and times == sorted(times) and 0.0 <= times[0] and times[-1] < r["t"]
        assert all(abs(x * CLIP_FPS - round(x * CLIP_FPS)) < 1e-6 for x in times)
        assert len(r["frame_indices"]) == len(times) <= TEST_MAX_IMAGES
        start, end = r["audio_span"]
        assert start == times[0] and abs(end - r["t"]) < 1e-3  # audio from the first frame up to T
        assert abs(r["audio_seconds"] - (end - start)) < 1e-3
        # The file plays on its own time: its positions are the timeline's times.
        assert r["frame_source_times"] == times and r["audio_source_span"] == r["audio_span"]
        assert r["answer"] and r["prompt_tokens"] > 0 and r["ttft_ms"] > 0
        assert r["settings"]["temperature"] == 0 and r["settings"]["max_tokens"] == 8
        assert r["settings"]["num_sample_frames"] == 16 and r["settings"]["store_max_pixels"] > 0
    # (the filter drops frames where the box hardly moved, so the newest kept one may be older)
    assert 1.0 < a[0]["frame_times"][-1] < a[1]["frame_times"][-1] < a[2]["frame_times"][-1]
    # The chat history carries the earlier questions (and answers) into later prompts.
    assert "What moves?" in a[1]["prompt"] and a[0]["answer"] in a[1]["prompt"]
    assert len({r["inputs_sha256"] for r in a}) == 3


@pytest.mark.engine
def test_nothing_is_written_without_out(run_plain, run_with_out):
    assert run_plain.res.returncode == 1, run_plain.res.stderr[-3000:]
    assert run_plain.after == run_plain.before  # neither the clip's folder nor the cwd gained a file
    assert all(r["bundle"] is None for r in answers(run_plain.lines))
    assert not any(run_with_out.cwd.iterdir())  # --out writes only under its folder


@pytest.mark.engine
def test_bundles_read_back_to_the_inputs_the_engine_hashed(run_with_out):
    a = answers(run_with_out.lines)
    folders = sorted(p for p in run_with_out.out.iterdir())
    assert [p.name for p in folders] == ["0001-t1.5", "0002-t2.0", "0003-t4.0"]
    assert [r["bundle"] for r in a] == [str(p) for p in folders]
    for rec, folder in zip(a, folders):
        bundle = bundles.read_bundle(folder)
        m = bundle.manifest
        assert m["version"] == 1 and m["question"] == rec["question"] and m["answer"] == rec["answer"]
        assert m["inputs_sha256"] == rec["inputs_sha256"] == bundle.digest()
        assert inputs_digest(bundle.frames, bundle.audio) == rec["inputs_sha256"]
        assert bundle.frame_times == rec["frame_times"] and bundle.frame_indices == rec["frame_indices"]
        assert [f"{f.shape[1]}x{f.shape[0]}" for f in bundle.frames] == rec["frame_sizes"]
        assert m["prompt"] == rec["prompt"] and m["model_option"] == "tiny" and m["t"] == rec["t"]
        # The seed it used (drawn, none was set) is recorded: a sampled answer replays exactly.
        assert m["settings"] == rec["settings"] and isinstance(m["seed"], int)
        assert m["seed"] == rec["seed"] == m["settings"]["seed"]
        assert m["engine"]["max_images"] == TEST_MAX_IMAGES
        assert m["timings"]["ttft_ms"] == rec["ttft_ms"] and m["tokens"]["prompt_tokens"] == rec["prompt_tokens"]
        assert [f["file"] for f in m["frames"]] == [f"frame-{i + 1:04d}.png" for i in range(len(bundle.frames))]
        assert [f["source_t"] for f in m["frames"]] == rec["frame_times"]
        assert m["record"]["source"] == {"kind": "file", "name": Path(rec["source"]).name}
        # The audio is a plain 16-bit PCM WAV at 16 kHz that any player (and the stdlib) opens.
        assert m["audio"]["format"] == "pcm16" and m["audio"]["span"] == rec["audio_span"]
        with wave.open(str(folder / "audio.wav")) as w:
            assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, AUDIO_RATE)
            assert w.getnframes() == bundle.audio.size == round(rec["audio_seconds"] * AUDIO_RATE)
    history = [bundles.read_bundle(p).manifest["history"] for p in folders]
    assert history[0] == []  # the failed question at 0 s is not part of the chat
    assert history[1] == [{"role": "user", "content": "What moves?"}, {"role": "assistant", "content": a[0]["answer"]}]
    assert len(history[2]) == 4


@pytest.fixture(scope="module")
def reask_run(run_with_out, watch_clips, tmp_path_factory):
    """The first bundle as a folder and the second as a zip, re-asked as a video (the model
    recorded in the bundles, 'tiny', since no --model is given); the same engine then
    replays the clip with hard cuts in watch mode (--watch is for the video file only)."""
    folders = sorted(run_with_out.out.iterdir())
    zipped = tmp_path_factory.mktemp("zips") / "second.zip"
    zipped.write_bytes(bundles.zip_bundles([folders[1]]))
    cwd = tmp_path_factory.mktemp("cwd_c")
    res = replay(str(folders[0]), str(zipped), str(watch_clips.cuts), *ENGINE_ARGS, "--set", "frames_as=video",
                 "--set", "temperature=0", "--watch", "What changed?", "--watch-every", "1", "--json", cwd=cwd)
    lines = json_lines(res.stdout)
    return types.SimpleNamespace(res=res, folders=folders, zipped=zipped,
                                 lines=[r for r in lines if r["source"] != str(watch_clips.cuts)],
                                 watch_lines=[r for r in lines if r["source"] == str(watch_clips.cuts)])


@pytest.mark.engine
def test_reasking_bundles_sends_the_same_inputs(reask_run, run_with_out):
    res = reask_run.res
    assert res.returncode == 0, res.stderr[-3000:]
    original = answers(run_with_out.lines)[:2]
    assert len(reask_run.lines) == 2
    for rec, orig, source in zip(reask_run.lines, original, [reask_run.folders[0], reask_run.zipped]):
        assert rec["source"] == str(source)
        assert rec["inputs_sha256"] == rec["bundle_inputs_sha256"] == orig["inputs_sha256"]
        assert rec["frame_times"] == orig["frame_times"] and rec["frame_indices"] == orig["frame_indices"]
        assert rec["audio_seconds"] == orig["audio_seconds"] and rec["t"] == orig["t"]
        # The audio goes back as the same clips (its 2-s segments, vidchat.media.audio).
        assert rec["audio_parts"] == orig["audio_parts"]
        assert rec["prompt"].count("<|AUDIO|>") == orig["prompt"].count("<|AUDIO|>") == max(1, len(orig["audio_parts"]))
        assert rec["frames_as"] == "video" and rec["video_fps"] and rec["answer"]
        assert rec["settings"]["frames_as"] == "video" and rec["settings"]["max_tokens"] == 8
        assert "<|VIDEO|>" in rec["prompt"] and "<|IMAGE|>" not in rec["prompt"]
        assert rec["question"] == orig["question"] and rec["bundle"] is None and rec["watch"] is False
    assert original[0]["question"] in reask_run.lines[1]["prompt"]  # the bundle's chat history came along


@pytest.mark.engine
def test_watch_mode_asks_once_per_scene_change(reask_run):
    assert reask_run.res.returncode == 0, reask_run.res.stderr[-3000:]
    watched = reask_run.watch_lines
    # One answer per hard cut, asked at the cut's first frame (file seconds).
    assert [r["t"] for r in watched] == pytest.approx(CUTS, abs=0.5 / CLIP_FPS), watched
    for k, r in enumerate(watched):
        assert r["watch"] is True and r["question"] == "What changed?" and r["answer"]
        assert r["frame_times"][-1] == r["t"]  # the new scene's frame is the newest the model got
        assert len(r["frame_times"]) == k + 2  # a solid colour keeps one frame per scene
        assert r["frames_as"] == "video" and r["settings"]["temperature"] == 0
    assert "What changed?" in watched[-1]["prompt"] and watched[0]["answer"] in watched[-1]["prompt"]  # history


# ---------------------------------------------------------------------------
# Usage errors (no engine is started)
# ---------------------------------------------------------------------------

@pytest.mark.unit
@pytest.mark.parametrize("args, message", [
    (["--ask", "soon:What?"], "expected SECONDS:QUESTION"),
    (["--ask", "1:"], "expected SECONDS:QUESTION"),
    (["--every", "0", "Q"], "--every expects a positive number"),
    (["--ask", "1:Q", "--set", "colour=blue"], "unknown setting(s) colour"),
    (["--ask", "1:Q", "--set", "temperature=warm"], "Invalid type for 'temperature'"),
    ([], "nothing to ask"),
    (["--watch", " "], "--watch expects a question"),
    (["--watch", "Q", "--watch-every", "0"], "--watch-every expects a positive number"),
])
def test_bad_usage_exits_2(clip_dir, tmp_path, args, message):
    res = replay(str(clip_dir / "clip.mp4"), "--model", "tiny", *args, cwd=tmp_path, timeout=120)
    assert res.returncode == 2, res.stderr
    assert message in res.stderr and res.stdout == ""
    assert not any(tmp_path.iterdir())


@pytest.mark.unit
def test_missing_file_exits_2(tmp_path):
    res = replay(str(tmp_path / "nope.mp4"), "--ask", "1:Q", cwd=tmp_path, timeout=120)
    assert res.returncode == 2 and "no such file" in res.stderr


# ---------------------------------------------------------------------------
# The media schedule (no engine)
# ---------------------------------------------------------------------------

@pytest.mark.unit
def test_media_events_are_in_file_seconds_and_audio_is_cut_at_question_times(clip_dir):
    from vidchat.qa.replay import Schedule, media_events

    schedule = Schedule([(1.5, "a"), (1.25, "b")], [(1.0, "c")])
    events = list(media_events(str(clip_dir / "clip.mp4"), schedule))
    frames = [t for t, _, kind, _ in events if kind == "frame"]
    assert frames == sorted(frames) and len(frames) == CLIP_SECONDS * CLIP_FPS
    assert np.allclose(frames, np.arange(len(frames)) / CLIP_FPS)
    assert [t for t, *_ in events] == sorted(t for t, *_ in events)
    chunks = [(t, payload.size) for t, _, kind, payload in events if kind == "audio"]
    assert chunks[0][0] == 0.0
    for (t, n), (t_next, _) in zip(chunks, chunks[1:]):
        assert abs(t + n / AUDIO_RATE - t_next) < 1e-9  # contiguous
    cuts = {1.0, 1.25, 1.5, 2.0, 3.0}
    for t, n in chunks:  # no chunk straddles a question's time
        assert not any(t + 1e-6 < c < t + n / AUDIO_RATE - 1e-6 for c in cuts)
    starts = {round(t, 6) for t, _ in chunks}
    assert cuts <= starts
    assert [(q.at, q.text) for q in (schedule.pop() for _ in range(6))] == [
        (1.0, "c"), (1.25, "b"), (1.5, "a"), (2.0, "c"), (3.0, "c"), (4.0, "c")]


def watch_times(path: Path, every_s: float) -> list[float]:
    """When replay's watch mode asks, for a file: a session fed as replay feeds it."""
    from vidchat.qa.replay import Playback, Schedule, media_events

    playback = Playback(Session("watch"), watch_every=every_s)
    return [t for t, _, kind, payload in media_events(str(path), Schedule([], [])) if playback.feed(t, kind, payload)]


@pytest.mark.unit
def test_watch_mode_fires_on_cuts_and_motion_not_on_a_still_scene(watch_clips, clip_dir):
    assert watch_times(watch_clips.cuts, 1.0) == pytest.approx(CUTS, abs=0.5 / CLIP_FPS)
    # The cuts at 3 and 4.5 s come within the interval after 1.5 s: one question
    # for both, at the first frame after the pause (1.5 + 3.45 s), on the file's clock.
    assert watch_times(watch_clips.cuts, 3.45) == pytest.approx([1.5, 5.0], abs=0.5 / CLIP_FPS)
    assert watch_times(watch_clips.still, 1.0) == []
    # A box moving across a still background (the CLI runs' clip) is motion
    # adding up, a scene change too (issue 59, point 7: a person waving at a
    # webcam saw nothing happen when only cuts counted).
    assert watch_times(clip_dir / "clip.mp4", 1.0) != []


# ---------------------------------------------------------------------------
# The bundle format (no engine)
# ---------------------------------------------------------------------------

def _answer(audio: bool = True, text: str = "an answer") -> Answer:
    """A finished answer over a real session's sample (the engine's part stubbed)."""
    session = Session("s")
    session.timeline_start = 0.0
    session.set_source("file", "clip.webm", 10.0, True, 1.0, t=-0.1)  # the file played from its 10.1 s
    rng = np.random.default_rng(3)
    for i in range(4):
        session.add_frame(rng.integers(0, 256, (120, 160, 3), dtype=np.uint8), t=0.5 * i)
    if audio:
        session.add_audio(0.3 * np.sin(np.arange(AUDIO_RATE * 2) / 7.0).astype(np.float32), t=0.0)
    sample = session.sample()
    stats = ReplyStats(frames=len(sample.frames), audio_seconds=0 if sample.audio is None else sample.audio.size
                       / AUDIO_RATE, inputs_sha256=inputs_digest(sample.frames, sample.audio), prompt_tokens=12)
    reply = types.SimpleNamespace(stats=stats, text=text, engine=types.SimpleNamespace(model_path="/m/tiny",
                                                                                   options=EngineOptions(model="/m/tiny")))
    return Answer("What is it?", reply, sample, AnswerOptions(temperature=0.0, seed=7), prompt_text="<prompt>")


@pytest.mark.unit
def test_bundle_round_trip_folder_and_zip(tmp_path):
    answer = _answer()
    path = bundles.write_bundle(tmp_path / "rec", answer, history=[Turn("user", "hi"), Turn("assistant", "yo")],
                                  t=1.5, source="camera", model_option="tiny")
    assert path.name == "0001-t1.5"
    assert sorted(p.name for p in path.iterdir()) == ["audio.wav", "frame-0001.png", "frame-0002.png",
                                                      "frame-0003.png", "frame-0004.png", "manifest.json"]
    second = bundles.write_bundle(tmp_path / "rec", _answer(audio=False))
    assert second.name == "0002" and not (second / "audio.wav").exists()
    bundle = bundles.read_bundle(path)
    assert bundle.digest() == bundle.inputs_sha256 == answer.reply.stats.inputs_sha256
    assert all(np.array_equal(a, b) for a, b in zip(bundle.frames, answer.sample.frames))
    assert bundle.audio.dtype == np.float32 and np.array_equal(bundle.audio, answer.sample.audio)
    assert bundle.manifest["history"] == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    assert bundle.history() == [Turn("user", "hi"), Turn("assistant", "yo")]
    assert bundle.manifest["seed"] == 7 and bundle.manifest["settings"]["temperature"] == 0.0
    assert bundle.frame_times == [0.0, 0.5, 1.0, 1.5] and bundle.manifest["audio"]["format"] == "pcm16"
    sample = bundle.sample()
    assert inputs_digest(sample.frames, sample.audio) == bundle.inputs_sha256

    data = bundles.zip_bundles([path, second])
    both = tmp_path / "both.zip"
    both.write_bytes(data)
    assert not bundles.is_bundle(both)
    with pytest.raises(bundles.BundleError, match="2 bundles"):
        bundles.read_bundle(both)
    one = tmp_path / "one.zip"
    one.write_bytes(bundles.zip_bundles([path]))
    assert bundles.is_bundle(one) and bundles.read_bundle(one).digest() == bundle.inputs_sha256
    assert sorted(p.name for p in tmp_path.iterdir()) == ["both.zip", "one.zip", "rec"]  # no temporary left


@pytest.mark.unit
def test_audio_that_is_not_16_bit_exact_is_kept_as_float_wav():
    audio = np.random.default_rng(1).uniform(-1, 1, 1000).astype(np.float32)
    data, fmt = bundles.wav_bytes(audio)
    assert fmt == "float32"
    back, rate = bundles.read_wav(data)
    assert rate == AUDIO_RATE and back.dtype == np.float32 and np.array_equal(back, audio)
    pcm = (np.arange(-32768, 32768, 97, dtype=np.int16).astype(np.float32) * np.float32(1 / 32768))
    data, fmt = bundles.wav_bytes(pcm)
    assert fmt == "pcm16" and np.array_equal(bundles.read_wav(data)[0], pcm)


@pytest.mark.unit
def test_bad_bundles_are_refused(tmp_path):
    path = bundles.write_bundle(tmp_path, _answer())
    manifest = json.loads((path / "manifest.json").read_text())
    for change, message in [({"version": 2}, "version 2"),
                            ({"frames": [{"file": "../x.png", "width": 1, "height": 1}]}, "bad file name"),
                            ({"question": ""}, "no question")]:
        (path / "manifest.json").write_text(json.dumps({**manifest, **change}))
        with pytest.raises(bundles.BundleError, match=message):
            bundles.read_bundle(path)
    (path / "manifest.json").write_text(json.dumps(manifest))
    (path / "frame-0002.png").unlink()
    with pytest.raises(bundles.BundleError, match="frame-0002.png is missing"):
        bundles.read_bundle(path)


@pytest.mark.unit
def test_a_zip_that_would_unpack_huge_is_refused_before_unpacking(tmp_path, monkeypatch):
    import zipfile

    path = bundles.write_bundle(tmp_path / "rec", _answer())
    bomb = tmp_path / "bomb.zip"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as zf:
        for child in sorted(path.iterdir()):
            if child.name != "frame-0001.png":
                zf.write(child, f"b/{child.name}")
        zf.writestr("b/frame-0001.png", b"\0" * (4 << 20))  # 4 MiB of zeros: a few KB packed
    monkeypatch.setattr(bundles, "MAX_MEMBER_BYTES", 1 << 20)
    with pytest.raises(bundles.BundleError, match="would unpack to 4194304 bytes"):
        bundles.read_bundle(bomb)
    many = json.loads((path / "manifest.json").read_text())
    many["frames"] = many["frames"] * 300
    (path / "manifest.json").write_text(json.dumps(many))
    with pytest.raises(bundles.BundleError, match="at most 1024"):
        bundles.read_bundle(path)


@pytest.mark.unit
def test_a_bundle_reads_back_as_a_finished_answer_for_the_page(tmp_path):
    answer = _answer()
    path = bundles.write_bundle(tmp_path / "rec", answer, history=[Turn("user", "hi"), Turn("assistant", "yo")])
    loaded = bundles.recorded_answer(bundles.read_bundle(path))
    assert loaded.bundle_name == path.name and loaded.question == answer.question
    assert loaded.reply.text == answer.reply.text and loaded.history == (Turn("user", "hi"), Turn("assistant", "yo"))
    assert loaded.options.seed == 7 and loaded.options.temperature == 0.0
    record = loaded.summary()
    assert record["inputs_sha256"] == answer.reply.stats.inputs_sha256 == inputs_digest(loaded.sample.frames,
                                                                                         loaded.sample.audio)
    assert record["frame_times"] == [0.0, 0.5, 1.0, 1.5] and record["model"] == "/m/tiny"
    assert record["prompt_tokens"] == 12 and record["prompt"] == "<prompt>"
    assert record["frame_source_times"] == [10.1, 10.6, 11.1, 11.6]
    assert record["source"] == {"kind": "file", "name": "clip.webm"}


@pytest.mark.unit
def test_periodic_questions_stop_with_the_file_but_later_asks_stay():
    from vidchat.qa.replay import Question, Schedule

    schedule = Schedule([(10.0, "late")], [(2.0, "tick")])
    assert [schedule.pop().at for _ in range(2)] == [2.0, 4.0]
    schedule.stop_periodic()  # the file ended at 5 s
    assert schedule.pop() == Question(10.0, "late", periodic=False)
    assert schedule.peek() is None
