"""Frame timing reaches the model's temporal positions, through real vLLM.

Why this matters: the EVS filter keeps only frames that changed, so the frames
of one question are unevenly spaced in time (a burst of motion, then seconds of
a still scene). Qwen-family models place each video's frames on the M-RoPE
time axis assuming a frame rate. When a question's frames go to the model as
one video, vidchat passes their real mean rate, ``fps = (n-1) / (t_last -
t_first)``, as ``mm_processor_kwargs={"fps": ...}``.

What is proven here, on the tiny random-weight models:

* Qwen2.5-Omni thinker: the HF processor turns fps into ``second_per_grid_ts =
  temporal_patch_size / fps``; vLLM stores it on the processed request and the
  model's own ``get_mrope_input_positions`` spaces the video's temporal
  positions by ``second_per_grid_ts * tokens_per_second``. The same 8 frames
  at 0.1 s steps, 1 s steps, and irregular steps therefore get different
  temporal positions (irregular spacing is expressed as its mean rate: one
  rate per video is all the family takes), and every variant still answers.
* Without usable times (none, one frame, all equal) no fps is passed and the
  processor falls back to its default rate; the answer still streams.
* Qwen2-VL (vision only): its processor produces no ``second_per_grid_ts``, so
  the temporal positions are the frame-group index whatever the spacing. This
  documents the family's limitation; passing fps must not break it either.

How: vLLM's ``AsyncLLM.input_processor.process_inputs`` (the step ``generate``
runs first) gives the processed ``EngineCoreRequest``; the model itself lives in
the engine-core process, so positions come from the model class's own
``get_mrope_input_positions`` called on a bare instance that carries only the HF
config it reads. Nothing is reimplemented from vLLM.
"""

from __future__ import annotations

import numpy as np
import pytest

from vidchat.engine import video_fps
from vidchat.engine.local import LocalEngine

pytestmark = pytest.mark.engine

N_FRAMES = 8
QUESTION = "What happens in the video?"

# Three spacings of the same 8 frames (seconds of media time).
SPACINGS = {
    "0.1 s steps": [0.1 * i for i in range(N_FRAMES)],
    "1 s steps": [1.0 * i for i in range(N_FRAMES)],
    # What the EVS filter leaves: bursts of motion between still stretches.
    "irregular": [0.0, 0.1, 0.2, 1.5, 1.6, 3.0, 3.1, 5.0],
}


def make_frames(n: int = N_FRAMES, size: int = 112) -> list[np.ndarray]:
    """Distinct RGB frames (each its own colour ramp), identical across calls so
    spacing is the only thing that differs between prepared questions."""
    ramp = np.linspace(0, 255, size, dtype=np.float32)
    out = []
    for i in range(n):
        frame = np.empty((size, size, 3), dtype=np.float32)
        frame[..., 0] = ramp[None, :]
        frame[..., 1] = ramp[:, None]
        frame[..., 2] = 255.0 * i / max(n - 1, 1)
        out.append(np.roll(frame, 9 * i, axis=1).astype(np.uint8))
    return out


async def processed(engine: LocalEngine, prepared) -> "EngineCoreRequest":  # noqa: F821
    """The EngineCoreRequest vLLM builds from a prepared prompt: tokenized, with
    the HF processor run on the media (the same call `AsyncLLM.add_request`
    makes for a raw prompt). It is inspected, never sent to the engine core."""
    llm = engine._llm
    # vLLM's sender-side media cache sends an item's data only the first time
    # (later requests carry data=None) and assumes the engine core then holds it.
    # Clearing before makes sure we see the data; clearing after keeps the cache
    # from believing the core holds items it never received.
    await llm.reset_mm_cache()
    try:
        return await llm.input_processor.process_inputs_async(
            "video-timing-probe", prepared.prompt, prepared.params, supported_tasks=await llm.get_supported_tasks()
        )
    finally:
        await llm.reset_mm_cache()


def video_feature(request):
    (feature,) = [f for f in request.mm_features if f.modality == "video"]
    return feature


def field(feature, name: str):
    """A processed field's tensor, or None when the processor did not produce it."""
    elem = feature.data.get(name)
    return None if elem is None else elem.data


def mrope_positions(engine: LocalEngine, request) -> tuple[np.ndarray, int]:
    """(3, n_tokens) M-RoPE positions and delta, from the served model class's
    own method, called exactly as vLLM's model runner calls it. The loaded model
    is in another process; the method reads only `self.config` (plus other
    methods of its class), so a bare instance holding that config is enough:
    no second model, no weights."""
    from vllm.model_executor.model_loader import get_model_architecture

    model_config = engine._llm.model_config
    model_cls, _ = get_model_architecture(model_config)
    bare = object.__new__(model_cls)  # skips nn.Module.__init__: nothing is built
    # As the classes' __init__ set it: the Omni thinker keeps hf_config.thinker_config,
    # Qwen2-VL the hf_config itself.
    config = getattr(model_config.hf_config, "thinker_config", model_config.hf_config)
    object.__setattr__(bare, "config", config)
    positions, delta = bare.get_mrope_input_positions(request.prompt_token_ids, request.mm_features)
    return positions.numpy(), int(delta)


def video_time_steps(engine: LocalEngine, request) -> tuple[np.ndarray, np.ndarray, int]:
    """For the video's tokens: the temporal position of each frame group
    relative to the first, the (h, w) positions, and the M-RoPE delta."""
    positions, delta = mrope_positions(engine, request)
    feature = video_feature(request)
    grid_t, grid_h, grid_w = field(feature, "video_grid_thw").tolist()
    off, length = feature.mm_position.offset, feature.mm_position.length
    merge = video_config(engine).spatial_merge_size
    assert length == grid_t * (grid_h // merge) * (grid_w // merge)
    video = positions[:, off : off + length].reshape(3, grid_t, -1)
    # All tokens of one frame group share a temporal position.
    assert (video[0] == video[0][:, :1]).all()
    return video[0][:, 0] - video[0][0, 0], video[1:], delta


def video_config(engine: LocalEngine):
    hf_config = engine._llm.model_config.hf_config
    return getattr(hf_config, "thinker_config", hf_config).vision_config


def tokens_per_second(engine: LocalEngine, default: float) -> float:
    # vLLM reads it with this same getattr default (25 for Omni, 1.0 for Qwen2-VL).
    return getattr(video_config(engine), "tokens_per_second", default)


async def stream_to_the_end(reply) -> None:
    async for _ in reply:
        pass


# ---- Qwen2.5-Omni thinker: spacing reaches the temporal positions ----------


async def test_omni_frame_spacing_sets_second_per_grid_and_temporal_positions(omni_engine: LocalEngine):
    frames = make_frames()
    temporal_patch = video_config(omni_engine).temporal_patch_size
    tps = tokens_per_second(omni_engine, default=25)
    seen = {}
    for name, times in SPACINGS.items():
        prepared = omni_engine.prepare(QUESTION, frames, frame_times=times, frames_as="video", max_tokens=4)
        fps = (N_FRAMES - 1) / (times[-1] - times[0])
        assert prepared.video_fps == pytest.approx(fps)
        assert prepared.prompt["mm_processor_kwargs"] == {"fps": prepared.video_fps}

        request = await processed(omni_engine, prepared)
        spg = field(video_feature(request), "second_per_grid_ts")
        assert spg is not None, f"{name}: the processor dropped fps"
        assert spg.item() == pytest.approx(temporal_patch / fps, rel=1e-6), name

        steps, spatial, delta = video_time_steps(omni_engine, request)
        # vLLM: t_index = (arange(grid_t) * second_per_grid_ts * tokens_per_second).astype(int64)
        expected = (np.arange(len(steps)) * spg.item() * tps).astype(np.int64)
        np.testing.assert_array_equal(steps, expected, err_msg=name)
        seen[name] = (spg.item(), steps, spatial, delta, len(request.prompt_token_ids))

    fast, slow, irregular = (seen[name] for name in SPACINGS)
    # Same frames, same tokens and spatial layout: only the time axis differs.
    assert fast[4] == slow[4] == irregular[4]
    np.testing.assert_array_equal(fast[2], slow[2])
    np.testing.assert_array_equal(fast[2], irregular[2])
    assert len({fast[0], slow[0], irregular[0]}) == 3
    # 10x slower frames sit 10x further apart in model time (0.1 s -> 5 position
    # steps per frame group at 25 tokens/s, 1 s -> 50).
    assert slow[1][1] == 10 * fast[1][1] > 0
    assert not np.array_equal(fast[1], irregular[1]) and not np.array_equal(slow[1], irregular[1])
    # The text after the video is pushed along with it.
    assert fast[3] < irregular[3] < slow[3]


@pytest.mark.parametrize("spacing", SPACINGS)
async def test_omni_video_answer_streams_for_each_spacing(omni_engine: LocalEngine, spacing: str):
    reply = omni_engine.ask(
        QUESTION, make_frames(), frames_as="video", frame_times=SPACINGS[spacing],
        max_tokens=4, ignore_eos=True, temperature=0.0,
    )
    await stream_to_the_end(reply)
    assert reply.stats.completion_tokens == 4
    assert reply.stats.finish_reason == "length" and not reply.stats.cancelled
    assert reply.stats.frames == N_FRAMES and reply.stats.prompt_tokens > 64
    assert omni_engine.running_requests == 0


# ---- no usable times: no fps, the processor's default rate ------------------

NO_RATE = {
    "no frame_times": dict(n=N_FRAMES, times=None),
    "one frame": dict(n=1, times=[2.0]),
    "all at one instant": dict(n=N_FRAMES, times=[3.0] * N_FRAMES),
    "times that do not match the frames": dict(n=N_FRAMES, times=[0.0, 1.0]),
}


@pytest.mark.parametrize("case", NO_RATE)
async def test_without_a_usable_rate_no_fps_is_passed_and_the_answer_streams(omni_engine: LocalEngine, case: str):
    n, times = NO_RATE[case]["n"], NO_RATE[case]["times"]
    frames = make_frames(n)
    assert video_fps(times, n) is None
    prepared = omni_engine.prepare(QUESTION, frames, frame_times=times, frames_as="video", max_tokens=4)
    assert prepared.video_fps is None
    assert "mm_processor_kwargs" not in prepared.prompt

    request = await processed(omni_engine, prepared)
    # The HF Omni processor's own default is 2 fps when none is given.
    spg = field(video_feature(request), "second_per_grid_ts")
    assert spg.item() == pytest.approx(video_config(omni_engine).temporal_patch_size / 2.0)

    reply = omni_engine.ask(QUESTION, frames, frame_times=times, frames_as="video",
                            max_tokens=4, ignore_eos=True, temperature=0.0)
    await stream_to_the_end(reply)
    assert reply.stats.completion_tokens == 4 and reply.stats.finish_reason == "length"


def test_frames_sent_as_images_never_carry_fps(omni_engine: LocalEngine):
    prepared = omni_engine.prepare(QUESTION, make_frames(4), frame_times=[0.0, 0.5, 1.0, 1.5], frames_as="images")
    assert prepared.video_fps is None and "mm_processor_kwargs" not in prepared.prompt


# ---- Qwen2-VL: the family cannot express spacing -----------------------------


async def test_qwen2_vl_temporal_positions_ignore_frame_spacing(vl_engine: LocalEngine):
    frames = make_frames()
    seen = {}
    for name, times in SPACINGS.items():
        prepared = vl_engine.prepare(QUESTION, frames, frame_times=times, frames_as="video", max_tokens=4)
        # vidchat still passes the rate (it does not special-case families) ...
        assert prepared.prompt["mm_processor_kwargs"] == {"fps": pytest.approx(video_fps(times, N_FRAMES))}
        request = await processed(vl_engine, prepared)
        # ... but Qwen2-VL's processor has nowhere to put it.
        assert field(video_feature(request), "second_per_grid_ts") is None, name
        steps, spatial, delta = video_time_steps(vl_engine, request)
        # Temporal position = frame-group index, whatever the real spacing.
        np.testing.assert_array_equal(steps, np.arange(len(steps)), err_msg=name)
        seen[name] = (steps, spatial, delta)

    first = seen["0.1 s steps"]
    for name, (steps, spatial, delta) in seen.items():
        np.testing.assert_array_equal(steps, first[0], err_msg=name)
        np.testing.assert_array_equal(spatial, first[1], err_msg=name)
        assert delta == first[2], name


async def test_qwen2_vl_video_answer_streams_with_fps_passed(vl_engine: LocalEngine):
    # The fps kwarg must be harmless for a processor that ignores it.
    reply = vl_engine.ask(QUESTION, make_frames(), frames_as="video", frame_times=SPACINGS["irregular"],
                          max_tokens=4, ignore_eos=True, temperature=0.0)
    await stream_to_the_end(reply)
    assert reply.stats.completion_tokens == 4 and reply.stats.finish_reason == "length"
    assert vl_engine.running_requests == 0
