"""Credentials kept out of the server's logs, and the page's polling kept
out of its access log: filters on uvicorn's loggers."""

from __future__ import annotations

import logging
import re
from typing import Any
from urllib.parse import parse_qsl

from vidchat.app.access import SECRET_PARAMS


def redact_query(target: str) -> str:
    """A request target with credential, session-id and answer-id values blanked."""
    target = re.sub(r"^/inputs/[^/?]+", "/inputs/…", target)
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
    return isinstance(arg, str) and ("?" in arg or arg.startswith("/inputs/"))


# What an open page (and a health check) asks every second or so: kept out
# of the access log when it succeeds (826 lines a minute with Talk on, once),
# so the log holds what a person would read. At --log-level debug they stay.
POLLED_PATHS = ("/webrtc/stats", "/webrtc/live", "/webrtc/talk", "/webrtc/events", "/api/health", "/readyz", "/metrics",
                "/gradio_api/heartbeat/",
                # and the page's static files, a line each per page load (the page itself, "/", stays)
                "/static/", "/assets/", "/svelte/", "/gradio_api/file=", "/favicon.ico")


class QuietPolling(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if not (isinstance(args, tuple) and len(args) >= 5) or logging.getLogger("vidchat").isEnabledFor(
                logging.DEBUG):
            return True
        _, method, path, _, status = args[:5]
        if method != "GET" or not isinstance(status, int) or not isinstance(path, str):
            return True
        path = path.split("?", 1)[0]
        if status == 503 and path in ("/api/health", "/readyz"):
            return False  # "not ready yet", asked over and over while the model loads
        return status >= 400 or not path.startswith(POLLED_PATHS)


def install_log_redaction() -> None:
    for name in ("uvicorn.access", "uvicorn.error"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactAccessLog) for f in logger.filters):
            logger.addFilter(RedactAccessLog())
    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, QuietPolling) for f in access.filters):
        access.addFilter(QuietPolling())
