"""Logging for the CLI: ``ckpt``'s own logger only, as text or JSON lines, on stderr.

botocore's and urllib3's loggers are never configured here: botocore's debug output prints session tokens.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import IO

__all__ = ["LEVELS", "configure_logging"]

LEVELS = ("debug", "info", "warning", "error")
# Attributes every LogRecord has; anything else was passed with extra= and is printed as a field.
_STANDARD = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName"}


def _fields(record: logging.LogRecord) -> dict[str, object]:
    return {k: v for k, v in record.__dict__.items() if k not in _STANDARD}


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        extra = " ".join(f"{k}={v}" for k, v in _fields(record).items())
        line = f"{stamp}Z {record.levelname.lower()} {record.getMessage()}"
        return f"{line} {extra}" if extra else line


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        from ckpt.cli.output import json_text  # only for --log-format json: keeps start-up light

        document: dict[str, object] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        document.update(_fields(record))
        return json_text(document, default=str)


def configure_logging(level: str = "info", fmt: str = "text", stream: IO[str] | None = None) -> None:
    """Send the ``ckpt`` logger's records at ``level`` and above to ``stream`` (stderr) as text or JSON."""
    logger = logging.getLogger("ckpt")
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(_JsonFormatter() if fmt == "json" else _TextFormatter())
    logger.addHandler(handler)
    logger.setLevel(level.upper())
    logger.propagate = False
