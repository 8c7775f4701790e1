"""Prometheus metrics: what an operator watches and alerts on.

Served at ``/metrics`` from prometheus_client's default registry, the one
vLLM's own Prometheus stat logger fills (its ``vllm:`` families, as ``vllm
serve`` exposes them), so an existing vLLM dashboard works on vidchat
unchanged and vidchat's own families sit beside them. prometheus_client is
the library the field scrapes with (and vLLM already depends on it): its
text format, histograms and thread-safe counters are not vidchat's to write.

Two kinds of figures:

* events, counted as they happen, through :class:`Metrics`'s hooks: frames
  received and kept (each session's ingest), answers and their first token
  and tokens (the conversation core's Done), engine restarts, event-loop lag;
* states, read at scrape time from the app (:class:`AppCollector`): sessions
  open, frame buffers' bytes, the fair queue, engines up, warm-ups counted
  by the prewarmer, and on a GPU its memory and utilisation (NVML).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import Any, Callable, Iterable, Protocol

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from vidchat.conversation.events import DOORS
from vidchat.conversation.host import Host
from vidchat.conversation.memory import Captioner
from vidchat.conversation.registry import SessionRegistry
from vidchat.conversation.warmup import Prewarmer


class Observed(Host, Protocol):
    """What /metrics reads of the app at scrape time (vidchat.app.state.AppState):
    the host's registry, queue and warm-ups, and whether each engine is up."""

    @property
    def registry(self) -> SessionRegistry: ...

    @property
    def prewarmer(self) -> Prewarmer | None: ...

    @property
    def ready(self) -> bool: ...

    @property
    def compare_model_path(self) -> str: ...

    @property
    def captioner(self) -> Captioner | None: ...


log = logging.getLogger(__name__)


FIRST_TOKEN_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

LOOP_LAG_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

# The prewarmer's counters (PrewarmStats) by the outcome label they are counted under.
WARMUP_OUTCOMES = {"completed": "warmups", "skipped_same_inputs": "skipped_same_inputs",
                   "skipped_busy": "skipped_busy", "skipped_budget": "skipped_budget", "aborted": "aborted",
                   "yielded": "yielded", "failed": "failed"}


def door_of(kind: str) -> str | None:
    """The door label of a registry kind; None for sessions of no door (a loaded bundle's re-asks)."""
    return DOORS.get(kind)


class Metrics:
    """vidchat's event counters (one set per process: Prometheus families
    are process-wide, like the registry they live in)."""

    def __init__(self, registry: Any = REGISTRY) -> None:
        self.frames_received = Counter("vidchat_frames_received_total", "Frames offered to a session's filter.",
                                       ["door"], registry=registry)
        self.frames_kept = Counter("vidchat_frames_kept_total", "Frames the filter kept in a session's buffer.",
                                   ["door"], registry=registry)
        # ``engine``: which engine answered (main, or compare: --compare-model);
        # ``kind``: what the answer was for (chat, watch, talk, reask, second),
        # so the second model's answers and re-asks neither count as the
        # chat's nor mix into its first-token times.
        self.answers = Counter("vidchat_answers_total", "Answers ended, by how they ended.",
                               ["door", "status", "engine", "kind"], registry=registry)
        self.first_token = Histogram("vidchat_first_token_seconds", "Question received to first token sent.",
                                     ["door", "engine", "kind"], buckets=FIRST_TOKEN_BUCKETS, registry=registry)
        self.answer_tokens = Counter("vidchat_answer_tokens_total", "Tokens generated for answers.",
                                     ["door", "engine", "kind"], registry=registry)
        self.loop_lag = Histogram("vidchat_event_loop_lag_seconds", "How late the event loop woke a timer.",
                                  buckets=LOOP_LAG_BUCKETS, registry=registry)
        self.engine_restarts = Counter("vidchat_engine_restarts_total", "Engines started again after they died.",
                                       ["engine"], registry=registry)

    def frame_counter(self, kind: str) -> Callable[[bool], None] | None:
        """A session's hook for each frame its filter judged (True: kept)."""
        door = door_of(kind)
        if door is None:
            return None
        received, kept = self.frames_received.labels(door), self.frames_kept.labels(door)

        def counted(was_kept: bool) -> None:
            received.inc()
            if was_kept:
                kept.inc()

        return counted

    def answer_done(self, kind: str, status: str, first_token_s: float | None, tokens: int, *,
                    engine: str = "main", run_kind: str = "chat") -> None:
        """The conversation core's hook at each answer's Done: ``kind`` is
        the session's registry kind (its door), ``engine`` the engine that
        answered, ``run_kind`` what the answer was for (vidchat.conversation.runs.AnswerRun.kind)."""
        door = door_of(kind)
        if door is None:
            return
        self.answers.labels(door, status, engine, run_kind).inc()
        if first_token_s is not None:
            self.first_token.labels(door, engine, run_kind).observe(max(0.0, first_token_s))
        if tokens:
            self.answer_tokens.labels(door, engine, run_kind).inc(tokens)


# The (engine, kind) pairs an answer can have, whose series exist from the
# start at 0: the main engine answers the chat, Watch, Talk and re-asks; the
# second model its Both-models answers and re-asks put to it.
ANSWER_SERIES = (("main", "chat"), ("main", "watch"), ("main", "talk"), ("main", "reask"),
                 ("compare", "second"), ("compare", "reask"))


_metrics: Metrics | None = None


def metrics() -> Metrics:
    """The process's metrics, registered on first use."""
    global _metrics
    if _metrics is None:
        _metrics = Metrics()
        for door in DOORS.values():  # every door's series from the start, at 0
            for engine, run_kind in ANSWER_SERIES:
                for status in ("completed", "cancelled", "failed"):
                    _metrics.answers.labels(door, status, engine, run_kind)
                _metrics.first_token.labels(door, engine, run_kind)
                _metrics.answer_tokens.labels(door, engine, run_kind)
            _metrics.frames_received.labels(door)
            _metrics.frames_kept.labels(door)
        for engine in ("main", "compare"):
            _metrics.engine_restarts.labels(engine)
    return _metrics


class AppCollector:
    """The app's state at scrape time. One per process, reading whichever
    app was last attached (a process serves one app; tests start several)."""

    def __init__(self) -> None:
        self.state: Observed | None = None
        self._gpu = GpuReader()

    def describe(self) -> Iterable[Metric]:
        return []  # collected lazily: the registry need not call collect() to register it

    def collect(self) -> Iterable[Metric]:
        state = self.state
        if state is None:
            return
        sessions = GaugeMetricFamily("vidchat_sessions", "Sessions open, by door.", labels=["door"])
        by_kind = state.registry.count_by_kind()
        for kind, door in DOORS.items():
            sessions.add_metric([door], by_kind.get(kind, 0))
        yield sessions
        yield GaugeMetricFamily("vidchat_answers_waiting", "Answers waiting for a place (--max-concurrent-answers).",
                                value=state.answer_gate.snapshot()["waiting"])
        yield GaugeMetricFamily("vidchat_session_buffer_bytes", "Bytes held by all sessions' frame buffers.",
                                value=sum(entry.session.memory_bytes for entry in state.registry.entries()))
        up = GaugeMetricFamily("vidchat_engine_up", "1: the engine answers; 0: loading, restarting or down.",
                               labels=["engine"])
        up.add_metric(["main"], 1.0 if state.ready else 0.0)
        if state.compare_model_path:
            up.add_metric(["compare"], 1.0 if state.readiness("compare")[0] else 0.0)
        yield up
        warmups = CounterMetricFamily("vidchat_warmups", "Warm-ups, by outcome.", labels=["outcome"])
        stats = state.prewarmer.stats if state.prewarmer is not None else None
        for outcome, attribute in WARMUP_OUTCOMES.items():
            warmups.add_metric([outcome], getattr(stats, attribute, 0) if stats is not None else 0)
        yield warmups
        yield from _memory_metrics(state)
        yield from self._gpu.collect()


def _memory_metrics(state: Observed) -> Iterable[Metric]:
    """The memory's captions by outcome, and each session's scene log (vidchat.conversation.memory)."""
    captions = CounterMetricFamily("vidchat_memory_captions", "Keyframe captions, by outcome: written, aborted "
                                   "(by an arriving question; written later), skipped (the engine was busy).",
                                   labels=["outcome"])
    stats = state.captioner.stats if state.captioner is not None else None
    for outcome in ("written", "aborted", "skipped", "failed"):
        captions.add_metric([outcome], getattr(stats, outcome, 0) if stats is not None else 0)
    yield captions
    keyframes = GaugeMetricFamily("vidchat_memory_keyframes", "Keyframes in a session's scene log.",
                                  labels=["session"])
    for entry in state.registry.entries():
        if len(entry.session.scene_log):
            keyframes.add_metric([entry.session.id[:8]], len(entry.session.scene_log))
    yield keyframes


class GpuReader:
    """GPU memory and utilisation through NVML (nvidia-ml-py, which vLLM
    pulls in on GPU installs); nothing at all where there is no GPU."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._tried = False

    def _handles(self) -> list[Any]:
        if not self._tried:
            self._tried = True
            try:
                import pynvml  # nvidia-ml-py

                pynvml.nvmlInit()
                self._nvml = pynvml
            except Exception:  # noqa: BLE001 - no NVML, no driver, no GPU: no GPU figures
                self._nvml = None
        if self._nvml is None:
            return []
        try:
            return [self._nvml.nvmlDeviceGetHandleByIndex(i) for i in range(self._nvml.nvmlDeviceGetCount())]
        except Exception:  # noqa: BLE001
            return []

    def snapshot(self) -> list[dict[str, Any]]:
        """Each GPU's figures (the page's live view shows them): index, used and total bytes, utilisation 0..1."""
        out = []
        for index, handle in enumerate(self._handles()):
            try:
                memory = self._nvml.nvmlDeviceGetMemoryInfo(handle)
                busy = self._nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0
            except Exception:  # noqa: BLE001
                continue
            out.append({"gpu": str(index), "memory_used_bytes": int(memory.used),
                        "memory_total_bytes": int(memory.total), "utilization_ratio": busy})
        return out

    def collect(self) -> Iterable[Metric]:
        gpus = self.snapshot()
        if not gpus:
            return
        memory = GaugeMetricFamily("vidchat_gpu_memory_used_bytes", "GPU memory in use.", labels=["gpu"])
        busy = GaugeMetricFamily("vidchat_gpu_utilization_ratio", "Share of time the GPU was busy.", labels=["gpu"])
        for gpu in gpus:
            memory.add_metric([gpu["gpu"]], gpu["memory_used_bytes"])
            busy.add_metric([gpu["gpu"]], gpu["utilization_ratio"])
        yield memory
        yield busy


_collector: AppCollector | None = None


def attach(state: Observed) -> Metrics:
    """Serve ``state``'s figures at /metrics; returns the event counters."""
    global _collector
    if _collector is None:
        _collector = AppCollector()
        REGISTRY.register(_collector)
    _collector.state = state
    return metrics()


CONTENT_TYPE = CONTENT_TYPE_LATEST


def exposition() -> bytes:
    """Every family, in Prometheus's text format. On the event loop: the app
    collector reads the session registry, which only the loop changes."""
    return generate_latest(REGISTRY)


def gpu_snapshot() -> list[dict[str, Any]]:
    """The GPUs' figures now (empty without a GPU)."""
    return (_collector._gpu if _collector is not None else GpuReader()).snapshot()


# Event-loop lag, measured from inside the server.
#
# A task asks to wake every ``interval_s`` and records how late it woke: that
# delay is how long something else held the event loop (a decode, a JSON
# parse, a template render), i.e. how long every other session's signalling,
# frames and streamed tokens waited. ``/api/health`` reports it, and
# ``bench/looplag.py`` reads it under load.

class LoopWatch:
    def __init__(self, interval_s: float = 0.01, keep: int = 6_000,
                 observe: Callable[[float], None] | None = None) -> None:
        self.interval_s = interval_s
        self._observe = observe  # each lag in seconds (the /metrics histogram)
        self._lags_ms: collections.deque[float] = collections.deque(maxlen=keep)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="loopwatch")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _run(self) -> None:
        while True:
            due = time.perf_counter() + self.interval_s
            await asyncio.sleep(self.interval_s)
            lag_s = max(0.0, time.perf_counter() - due)
            self._lags_ms.append(lag_s * 1000)
            if self._observe is not None:
                self._observe(lag_s)

    def reset(self) -> None:
        """Start a new measurement window (the benchmark calls this before loading the server)."""
        self._lags_ms.clear()

    def snapshot(self) -> dict[str, Any]:
        lags = sorted(self._lags_ms)
        if not lags:
            return {"samples": 0, "p50_ms": None, "p99_ms": None, "max_ms": None}

        def pick(q: float) -> float:
            return round(lags[min(len(lags) - 1, int(q * (len(lags) - 1)))], 2)

        return {"samples": len(lags), "p50_ms": pick(0.5), "p99_ms": pick(0.99), "max_ms": round(lags[-1], 2)}
