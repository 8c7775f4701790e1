"""``--log-format json``: one JSON object per log line, for a log collector
(Loki, Elasticsearch, a Space's log viewer piped to jq): ``time`` (UTC,
ISO 8601), ``level``, ``logger``, ``message`` and, where the line is about
one, ``session`` (a short hash of its id), ``door`` and ``answer_id``."""

from __future__ import annotations

import datetime
import json
import logging
import os
from pathlib import Path

from vidchat.conversation import log_context

VLLM_LOGGING_CONFIG = Path(__file__).with_name("vllm_json_logging.json")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc)
            .isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **log_context.current(),
        }
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def use_json_logs() -> None:
    """Every handler of the root logger writes JSON, and uvicorn's loggers go
    through the root's (the server is then started with log_config=None)."""
    # vLLM configures its loggers from this file, in the server and in its
    # engine-core child alike (which inherits the environment): JSON, errors only.
    os.environ.setdefault("VLLM_LOGGING_CONFIG_PATH", str(VLLM_LOGGING_CONFIG))
    root = logging.getLogger()
    for handler in root.handlers:
        handler.setFormatter(JsonFormatter())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
