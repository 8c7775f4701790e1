"""Re-asking a recorded bundle: its exact frames, audio and chat history put
to an engine again through the app's one answer path, with its recorded
settings changed by --set and the app's answer flags. Frame selection is
frozen (only ``num_sample_frames`` may pick fewer of the bundle's frames), so
unchanged frames and audio give the bundle's own ``inputs_sha256``."""

from __future__ import annotations

import dataclasses
import logging
import sys
from typing import Any

from vidchat.qa.replay_run import FAILED, USAGE, Run, answer_record, replay_session

log = logging.getLogger("vidchat.qa.replay")

# Keys of the answer options the app also sets by flags (--temperature ...).
_ANSWER_FLAGS = ("frames_as", "max_tokens", "temperature", "system_prompt")


def _bundle_options(run: Run, recorded: dict[str, Any]) -> Any:
    """A bundle's recorded answer options, then the app's answer flags where
    given (not at their default), then --set."""
    from vidchat.app.settings import Settings
    from vidchat.conversation.answer_path import AnswerOptions

    names = {f.name for f in dataclasses.fields(AnswerOptions)}
    options = AnswerOptions(**{k: v for k, v in recorded.items() if k in names})
    defaults = Settings()
    flags = {k: getattr(run.settings, k) for k in _ANSWER_FLAGS if getattr(run.settings, k) != getattr(defaults, k)}
    if "system_prompt" in flags:
        flags["system_prompt"] = flags["system_prompt"] or None
    return options.updated(**flags, **run.changes.answer)


async def reask_bundle(run: Run, state: Any, bundle: Any) -> int:
    """Re-ask one bundle on the engine of ``run.role`` (as it is now) and
    print its answer; an exit status (0, FAILED or USAGE)."""
    from vidchat.conversation import answer_path
    from vidchat.engine import EngineError
    from vidchat.media.session import SessionSettings
    from vidchat.media.sampling import uniform_indices

    manifest = bundle.manifest
    recorded = dict(manifest.get("settings") or {})
    options = _bundle_options(run, recorded)
    frozen = sorted(set(run.changes.session) - {"num_sample_frames"})
    if frozen:
        print(f"vidchat.replay: a bundle's frames are fixed: {', '.join(frozen)} cannot change "
              "(num_sample_frames may pick fewer of them)", file=sys.stderr)
        return USAGE
    sample = bundle.sample()
    n_frames = run.changes.session.get("num_sample_frames")
    if n_frames is not None:
        if not isinstance(n_frames, int) or n_frames < 1:
            print(f"vidchat.replay: num_sample_frames must be a positive integer, got {n_frames!r}",
                  file=sys.stderr)
            return USAGE
        sample = sample.frames_at(uniform_indices(len(sample.frames), n_frames))
    try:
        engine = await state.engine_for(run.role)
    except EngineError as exc:
        run.output.failure(manifest.get("t"), bundle.question, str(exc))
        return FAILED
    try:
        answer_path.check_options(options, engine)
        engine.check_request(len(sample.frames), options.frames_as)
    except (ValueError, EngineError) as exc:
        print(f"vidchat.replay: {exc}", file=sys.stderr)
        return USAGE
    if bundle.digest() != bundle.inputs_sha256:
        log.warning("%s: its frames and audio hash to %s, not to the recorded inputs_sha256 %s (edited?)",
                    bundle.path, bundle.digest(), bundle.inputs_sha256)
    session_names = {f.name for f in dataclasses.fields(SessionSettings)}
    settings = {**{k: v for k, v in recorded.items() if k in session_names or k == "store_max_pixels"},
                **dataclasses.asdict(options)}
    if n_frames is not None:
        settings["num_sample_frames"] = n_frames
    history = [] if run.args.no_history else bundle.history()
    t = manifest.get("t")
    # The app's one answer path, with the bundle's frozen sample in place of a buffer's.
    error = None
    async with replay_session(state, "re-ask finished") as entry:
        try:
            done = await (await entry.ask(bundle.question, options, engine=engine, history=history, sample=sample,
                                          spoken=bundle.spoken)).finish()
        except EngineError as exc:
            done, error = None, str(exc)
    if done is not None:
        error = done.error
    if error:
        run.output.failure(t, bundle.question, error)
        return FAILED
    _say_reasked(run, engine, bundle, done.answer, settings, history, t)
    return 0


def _say_reasked(run: Run, engine, bundle, answer, settings: dict[str, Any], history: Any, t: float | None) -> None:
    """A re-asked bundle's line (and its own bundle with --out)."""
    rec = answer_record(answer, t=t, settings=settings, source=bundle.path)
    rec["bundle_inputs_sha256"] = bundle.inputs_sha256
    if run.out_dir:
        from vidchat.conversation.recording import write_bundle

        rec["bundle"] = str(write_bundle(run.out_dir, answer, history=history, settings=settings, t=t,
                                         source=bundle.path, model_option=run.model_option,
                                         engine_options=engine.options))
    run.output.answer(rec)
