"""Suite runs and replays as a library (issue 58, point 3), without a model:
every session they open is closed however they end. A case whose engine
fails mid-run, one whose engine raises what nobody expected, settings the
engine refuses, and a run cancelled mid-case (the server's shutdown) all
leave the host's registry empty, and each says what happened in its result
or its typed error rather than on stdout."""

from __future__ import annotations

import asyncio
import types
from pathlib import Path

import pytest
from test_replay import make_clip

from vidchat.conversation.answers import AnswerOptions
from vidchat.conversation.registry import SessionRegistry
from vidchat.engine import EngineError, EngineOptions
from vidchat.qa import replay, suite
from vidchat.qa.suite_file import read_suite

pytestmark = pytest.mark.unit

SUITE = """name = "door-checks"
[[case]]
name = "box"
video = "clip.mp4"
  [[case.ask]]
  at = 0.5
  question = "What moves?"
  [[case.ask]]
  at = 1.0
  question = "And now?"
"""


class _Engine:
    """Enough of an engine for the settings check a replay makes before it plays."""

    def __init__(self, refuses: bool = False) -> None:
        self.options = EngineOptions(model="fake")
        self.refuses = refuses

    def check_request(self, frames: int, frames_as: str) -> None:
        if self.refuses:
            raise EngineError(f"this model takes fewer than {frames} frames")


class _Host:
    """A host (vidchat.qa.replay.ReplayHost) whose engine is looked up
    through ``engines``: each call of engine_for takes the next of them (an
    engine, an exception to raise, or an event to wait on for good)."""

    def __init__(self, *engines: object) -> None:
        self.settings = types.SimpleNamespace(model="fake", compare_model="", record_dir="", suite_dir="",
                                              suite_keep_runs=0)
        self.registry = SessionRegistry(host=self)
        self.answer_gate = self.metrics = self.prewarmer = None
        self.engines = list(engines)
        self.opened = 0
        self.waiting = asyncio.Event()  # an ask waits on an event of ``engines``

    def new_session(self, kind: str):
        self.opened += 1
        return self.registry.create(kind)

    def engine_now(self, role: str = "main"):
        return None

    async def engine_for(self, role: str = "main"):
        step = self.engines.pop(0)
        if isinstance(step, BaseException):
            raise step
        if isinstance(step, asyncio.Event):
            self.waiting.set()
            await step.wait()
        return step

    def readiness(self, role: str = "main") -> tuple[bool, str]:
        return True, "ready"

    def answer_defaults(self) -> AnswerOptions:
        return AnswerOptions()


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    return make_clip(tmp_path_factory.mktemp("clip") / "clip.mp4", seconds=1.5, tone=False)


def _suite(tmp_path: Path, clip: Path):
    (tmp_path / "suite.toml").write_text(SUITE)
    (tmp_path / "clip.mp4").symlink_to(clip)
    return read_suite(tmp_path)


async def test_an_engine_that_fails_mid_run_fails_the_asks_and_leaves_no_session(tmp_path, clip):
    # The settings check gets the engine; the first question finds it down for good.
    host = _Host(_Engine(), EngineError("The model engine has stopped."), EngineError("The model engine has stopped."))
    results = await suite.ask_cases(_suite(tmp_path, clip), host, "fake", tmp_path / "out", 2, {})
    assert [(r.status, r.error) for r in results] == [("error", "The model engine has stopped.")] * 2
    assert host.opened == 1 and len(host.registry) == 0


async def test_an_engine_that_raises_what_nobody_expected_is_the_cases_error_and_leaves_no_session(tmp_path, clip):
    host = _Host(_Engine(), RuntimeError("the engine's process vanished"))
    results = await suite.ask_cases(_suite(tmp_path, clip), host, "fake", tmp_path / "out", 2, {})
    assert [r.error for r in results] == ["clip.mp4: the engine's process vanished"] * 2
    assert host.opened == 1 and len(host.registry) == 0


async def test_settings_the_engine_refuses_are_a_typed_error_and_leave_no_session(tmp_path, clip):
    host = _Host(_Engine(refuses=True))
    plan = replay.ReplayPlan(asks=[(0.5, "What moves?")])
    with pytest.raises(replay.SettingsRefused, match="takes fewer than"):
        await replay.replay_sources(host, plan, [str(clip)])
    assert host.opened == 1 and len(host.registry) == 0
    # A suite says it as the case's error instead, and goes on.
    results = await suite.ask_cases(_suite(tmp_path, clip), _Host(_Engine(refuses=True)), "fake", tmp_path / "o", 1, {})
    assert {r.error for r in results} == {"case 'box': its settings can't be asked on this model"}


async def test_a_run_cancelled_mid_case_leaves_no_session(tmp_path, clip, capsys):
    never = asyncio.Event()
    host = _Host(_Engine(), never)  # the first question waits for an engine that never comes
    run = asyncio.create_task(suite.ask_cases(_suite(tmp_path, clip), host, "fake", tmp_path / "out", 2, {}))
    await host.waiting.wait()  # the case's session is open and its question waits
    assert len(host.registry) == 1
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert len(host.registry) == 0
    assert capsys.readouterr().out == ""  # the library printed nothing
