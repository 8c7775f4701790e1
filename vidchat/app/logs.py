"""``--log-format json``: one JSON object per log line, for a log collector
(Loki, Elasticsearch, a Space's log viewer piped to jq): ``time`` (UTC,
ISO 8601), ``level``, ``logger``, ``message`` and, where the line is about
one, ``session`` (a short hash of its id), ``door`` and ``answer_id``.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import re
import warnings
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from vidchat.app.access import SECRET_PARAMS
from vidchat.conversation import events

VLLM_LOGGING_CONFIG = Path(__file__).with_name("vllm_json_logging.json")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc)
            .isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **events.current(),
        }
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def use_json_logs() -> None:
    """Every handler of the root logger writes JSON (uvicorn's loggers go
    through the root's: :func:`uvicorn_through_root`)."""
    # vLLM configures its loggers from this file, in the server and in its
    # engine-core child alike (which inherits the environment): JSON, errors only.
    os.environ.setdefault("VLLM_LOGGING_CONFIG_PATH", str(VLLM_LOGGING_CONFIG))
    root = logging.getLogger()
    for handler in root.handlers:
        handler.setFormatter(JsonFormatter())


def uvicorn_through_root() -> None:
    """uvicorn's request and server lines go through the root logger's
    handler, so each has its time like every other line (uvicorn's own
    format has none); the server is started with log_config=None."""
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True


# Credentials kept out of the server's logs, and the page's polling kept
# out of its access log: filters on uvicorn's loggers.

def redact_query(target: str) -> str:
    """A request target with credential, session-id and answer-id values blanked."""
    target = re.sub(r"^/(inputs|sessions)/[^/?]+", r"/\1/…", target)
    path, sep, query = target.partition("?")
    if not sep:
        return target
    pairs = parse_qsl(query, keep_blank_values=True)
    return path + "?" + "&".join(f"{k}={'…' if k in SECRET_PARAMS else v}" for k, v in pairs)


class RedactAccessLog(logging.Filter):
    """Keeps tokens and session ids out of uvicorn's request lines (the HTTP
    access log and its WebSocket "accepted"/"rejected" lines)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and any(_has_secret(a) for a in args):
            record.args = tuple(redact_query(a) if _has_secret(a) else a for a in args)
        return True


def _has_secret(arg: Any) -> bool:
    return isinstance(arg, str) and ("?" in arg or arg.startswith(("/inputs/", "/sessions/")))


# What an open page (and a health check) asks every second or so: kept out
# of the access log when it succeeds (826 lines a minute with Talk on, once),
# so the log holds what a person would read. At --log-level debug they stay.
POLLED_PATHS = ("/webrtc/stats", "/webrtc/live", "/webrtc/talk", "/webrtc/events", "/api/health", "/readyz", "/metrics",
                "/gradio_api/heartbeat/",
                # and the page's static files, a line each per page load (the page itself, "/", stays)
                "/static/", "/assets/", "/svelte/", "/gradio_api/file=", "/favicon.ico")


# ...and the memory strip under the preview (vidchat.doors.memory_routes): the log and its thumbnails.
POLLED_SESSION_PATHS = re.compile(r"/sessions/[^/]+/memory(/\d+\.jpg)?")

# ...and what it reports as often: a playing file's position, every second.
POLLED_POSTS = ("/webrtc/source",)


class QuietPolling(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if not (isinstance(args, tuple) and len(args) >= 5) or logging.getLogger("vidchat").isEnabledFor(
                logging.DEBUG):
            return True
        _, method, path, _, status = args[:5]
        if method not in ("GET", "POST") or not isinstance(status, int) or not isinstance(path, str):
            return True
        if method == "POST" and path.split("?", 1)[0] not in POLLED_POSTS:
            return True
        path = path.split("?", 1)[0]
        if status == 503 and path in ("/api/health", "/readyz"):
            return False  # "not ready yet", asked over and over while the model loads
        if method == "POST" and path in POLLED_POSTS:
            return status >= 400
        return status >= 400 or not (path.startswith(POLLED_PATHS) or POLLED_SESSION_PATHS.fullmatch(path))


def install_log_redaction() -> None:
    for name in ("uvicorn.access", "uvicorn.error"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactAccessLog) for f in logger.filters):
            logger.addFilter(RedactAccessLog())
    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, QuietPolling) for f in access.filters):
        access.addFilter(QuietPolling())


# What reaches the console: vidchat's own lines (which model, which
# device, ready, where to open the page, any fallback and why) and, from the
# libraries under it (vLLM, transformers, torch, tqdm), only errors, unless
# the user asks for everything (--log-level debug, replay --verbose).
#
# Set through the environment as well, so vLLM's engine-core child process,
# which inherits it, is as quiet as the server.

NOISY_LOGGERS = ("httpx", "huggingface_hub", "urllib3", "torch", "transformers", "vllm")


def quiet_libraries() -> None:
    """Keep the libraries' warnings a user can do nothing about (a missing
    libtcmalloc, Triton on a CPU, a random test model's out-of-vocabulary
    special tokens, deprecations inside vLLM) off the console."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    # torch sets its own loggers' levels from TORCH_LOGS when it is imported,
    # over the one set below ("Triton not available" on every CPU start).
    os.environ.setdefault("TORCH_LOGS", "-torch")
    os.environ.setdefault("TQDM_DISABLE", "1")  # the weight-loading progress bar
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    warnings.simplefilter("ignore")
    for noisy in NOISY_LOGGERS:
        logging.getLogger(noisy).setLevel(logging.ERROR)
    # aioice says every ICE candidate pair of every connection at INFO; its warnings stay.
    logging.getLogger("aioice").setLevel(logging.WARNING)
