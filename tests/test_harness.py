"""The harness's own helpers (vidchat.devtools.harness and .free_ports) and the tier guard."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from vidchat.devtools import harness
from vidchat.devtools.harness import NeverHappened, allocate_port, eventually, eventually_async
from vidchat.devtools.tiers import MachineShare

pytestmark = pytest.mark.unit

pytest_plugins = ["pytester"]
PLUGIN_ARGS = ("-p", "vidchat.devtools.tiers", "-p", "no:cacheprovider", "-q", "-o", "asyncio_mode=auto")


def test_eventually_returns_the_first_truthy_value():
    calls = iter([None, 0, {}, "ready", "later"])
    assert eventually(lambda: next(calls), 5, "it is ready", interval=0) == "ready"


def test_eventually_names_what_never_happened_and_what_it_saw():
    with pytest.raises(NeverHappened) as failed:
        eventually(lambda: [], 0.05, "the buffer holds 16 frames", interval=0.01)
    text = str(failed.value)
    assert text == "within 0.05 s, never: the buffer holds 16 frames (last seen: [])", text


def test_eventually_treats_an_exception_as_not_yet_and_reports_it():
    attempts = []

    def flaky():
        attempts.append(1)
        if len(attempts) < 3:
            raise ConnectionRefusedError("not listening yet")
        return True

    assert eventually(flaky, 5, "it listens", interval=0) is True
    with pytest.raises(NeverHappened, match="ConnectionRefusedError"):
        eventually(lambda: (_ for _ in ()).throw(ConnectionRefusedError("never")), 0.02, "x", interval=0.005)


def test_an_assertion_in_the_predicate_fails_at_once():
    calls = []

    def exited():
        calls.append(1)
        assert False, "the server exited"

    with pytest.raises(AssertionError, match="the server exited"):
        eventually(exited, 30, "the server is ready", interval=0)
    assert len(calls) == 1


async def test_eventually_async_awaits_coroutine_predicates_and_lets_the_loop_run():
    ticks = []

    async def producer():
        for i in range(3):
            ticks.append(i)
            await asyncio.sleep(0)

    task = asyncio.create_task(producer())

    async def three_ticks():
        return len(ticks) >= 3

    assert await eventually_async(three_ticks, 5, "the producer ticks three times", interval=0) is True
    await task
    with pytest.raises(NeverHappened, match="never: nothing"):
        await eventually_async(lambda: False, 0.02, "nothing", interval=0.005)


def test_allocated_ports_are_free_distinct_and_outside_the_ephemeral_range():
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low, _high = map(int, f.read().split())
    ports = [allocate_port() for _ in range(50)]
    assert len(set(ports)) == 50
    assert all(harness._PORT_LOW <= p < harness._PORT_HIGH < low for p in ports)
    for port in ports[:5]:  # nothing listens there: a server can bind it
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_taken_port_is_skipped():
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    try:
        # Point the allocator at a port that is in use, then at the rest of its stretch.
        busy = allocate_port()
        with socket.socket() as holder:
            holder.bind(("127.0.0.1", busy))
            low, high = harness._PORT_LOW, harness._PORT_HIGH
            harness._port_counter = iter(range(busy - low, high - low))
            assert allocate_port() == busy + 1
    finally:
        taken.close()
        harness._port_counter = __import__("itertools").count(int(time.time()) % 1000)


def test_a_unit_test_that_starts_an_engine_a_server_or_chromium_fails(pytester):
    pytester.makepyfile(test_sneaky='''
import pytest
from playwright.async_api import async_playwright
from vidchat.devtools import harness
from vidchat.engine import EngineOptions
from vidchat.engine.local import LocalEngine

pytestmark = pytest.mark.unit

def test_engine():
    LocalEngine.start(EngineOptions(model="x"))

def test_server(tmp_path):
    harness.start_server([], tmp_path / "log")

async def test_browser():
    async with async_playwright() as pw:
        await pw.chromium.launch(executable_path="/usr/bin/chromium")

def test_plain():
    assert 1 + 1 == 2
''')
    result = pytester.runpytest_inprocess(*PLUGIN_ARGS)
    result.assert_outcomes(passed=1, failed=3)
    out = result.stdout.str()
    for what in ("a vLLM engine", "a vidchat server", "Chromium"):
        assert f"a unit-tier test must not start {what}" in out, out


def test_a_test_without_a_tier_or_with_two_is_a_usage_error(pytester):
    pytester.makepyfile(test_untiered='''
import pytest

def test_nothing():
    pass

@pytest.mark.unit
@pytest.mark.engine
def test_both():
    pass
''')
    result = pytester.runpytest_inprocess(*PLUGIN_ARGS)
    err = result.stderr.str() + result.stdout.str()
    assert "no tier marker (unit, engine or browser): test_untiered.py::test_nothing" in err, err
    assert "more than one tier marker" in err and "test_both" in err, err


def test_work_units_name_real_modules_and_keep_shared_fixtures_on_one_worker():
    """The xdist scheduler's table (conftest): every module it names exists,
    the longest-first list names only real units, and modules sharing a
    session fixture form one unit."""
    from pathlib import Path

    import conftest

    modules = {p.stem for p in Path(conftest.__file__).parent.glob("test_*.py")}
    assert set(conftest.SHARED_FIXTURE_GROUPS) <= modules
    units = {conftest.work_unit(f"tests/{m}.py::t") for m in modules}
    assert set(conftest.LONGEST_FIRST) <= units, set(conftest.LONGEST_FIRST) - units
    assert len(conftest.LONGEST_FIRST) == len(set(conftest.LONGEST_FIRST))
    assert conftest.work_unit("tests/test_hosting.py::test_x[token]") == conftest.work_unit(
        "tests/test_remote_engine.py::test_y") == "vllm-serve"
    assert conftest.work_unit("tests/test_page.py::test_z") == "test_page"


OTHER_WORKER = """
import sys
from pathlib import Path
from vidchat.devtools.tiers import MachineShare
share = MachineShare(sys.argv[1], Path(sys.argv[2]))
share.test_starts()
print("holding", flush=True)
sys.stdin.readline()  # until told its test is over
(Path(sys.argv[2]) / "other-test-ended").write_text("yes")
share.test_ends()
"""


async def test_a_step_alone_waits_for_the_other_workers_running_test(tmp_path):
    import subprocess
    import sys

    other = subprocess.Popen([sys.executable, "-c", OTHER_WORKER, "run-1", str(tmp_path)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline().strip() == "holding"
        share = MachineShare("run-1", tmp_path)
        share.test_starts()  # two tests share the machine

        seen_inside: list[bool] = []

        async def step_alone() -> None:
            async with share.alone():
                seen_inside.append((tmp_path / "other-test-ended").exists())

        task = asyncio.create_task(step_alone())

        def turnstile_taken() -> bool:  # held while the step waits for the other test
            import fcntl

            with open(tmp_path / "vidchat-tests-run-1.turnstile", "ab") as f:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return True
                fcntl.flock(f, fcntl.LOCK_UN)
                return False

        await eventually_async(lambda: asyncio.to_thread(turnstile_taken), 10, "the step waits its turn")
        assert not task.done()
        other.stdin.write("done\n")
        other.stdin.flush()
        await asyncio.wait_for(task, 10)
        assert seen_inside == [True], "the step ran while the other worker's test still held the machine"
        share.test_ends()
        share.close()
    finally:
        other.kill()
        other.wait()


async def test_without_workers_alone_locks_nothing(tmp_path):
    share = MachineShare(None, tmp_path)
    share.test_starts()
    async with share.alone():
        pass
    share.test_ends()
    assert list(tmp_path.iterdir()) == []


def test_the_timeline_names_each_workers_idle_tail_and_the_longest_units():
    from conftest import load_script

    timeline = load_script("scripts/timeline.py")
    lines = [
        {"worker": "gw0", "unit": "test_page", "test": "a", "start": 100.0, "end": 160.0},
        {"worker": "gw0", "unit": "test_page", "test": "b", "start": 160.0, "end": 190.0},
        {"worker": "gw1", "unit": "vllm-serve", "test": "c", "start": 101.0, "end": 130.0},
    ]
    out = timeline.report(lines, top=5)
    assert out[0].startswith("run: 90 s")
    assert "gw0: 2 tests, busy 90 s, idle at the end 0 s" in out
    assert "gw1: 1 tests, busy 29 s, idle at the end 60 s" in out
    units = [line.split()[:2] for line in out[4:]]
    assert units == [["gw0", "test_page"], ["gw1", "vllm-serve"]]
