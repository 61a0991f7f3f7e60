"""moto's S3 server where two concurrent conditional creates of one key both win, every time.

Run from ``tests/`` as ``python -m support.racy_moto_server -H 127.0.0.1 -p PORT``.

Why: several S3-compatible servers checked ``If-None-Match: *`` and then wrote, letting two *concurrent*
writers of one key both succeed while any *sequential* check passed. Stock moto has the same window, but
hitting it is luck. Here a ``PutObject`` with ``If-None-Match: *`` that passed its check waits, before it
writes, until a second conditional put of the same key has passed its check too (the first one only, and at
most ``_PARTNER_SECONDS``): so of conditional puts sent at once at least two write and answer 200, and a
lone one (a sequential probe) is only delayed and then behaves as S3 does. Nothing else changes.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

_PARTNER_SECONDS = 30.0  # generous: a loaded machine may take seconds to send the second


def _pause_between_check_and_write() -> None:
    from moto.s3.models import S3Backend
    from moto.s3.responses import S3Response

    request = threading.local()
    passed: dict[tuple[str, str], int] = {}  # conditional puts of a key that passed the check so far
    second_passed: dict[tuple[str, str], threading.Event] = {}
    lock = threading.Lock()
    respond_put = S3Response.put_object
    store_put = S3Backend.put_object

    def put_object_response(self: Any) -> Any:
        request.conditional = self.headers.get("If-None-Match") == "*"
        try:
            return respond_put(self)
        finally:
            request.conditional = False

    def put_object(self: Any, bucket_name: str, key_name: str, *args: Any, **kwargs: Any) -> Any:
        if getattr(request, "conditional", False):  # it passed the check: the key did not exist
            key = (bucket_name, key_name)
            with lock:
                passed[key] = count = passed.get(key, 0) + 1
                event = second_passed.setdefault(key, threading.Event())
            if count == 1:
                # The first one holds its write until a second one passed the check too (which it does,
                # since nothing is written yet), or, alone, for at most _PARTNER_SECONDS.
                event.wait(_PARTNER_SECONDS)
            elif count == 2:
                event.set()
        return store_put(self, bucket_name, key_name, *args, **kwargs)

    S3Response.put_object = put_object_response  # type: ignore[method-assign]
    S3Backend.put_object = put_object  # type: ignore[method-assign]


def main() -> None:
    """Start moto's server (same arguments as ``python -m moto.server``) with the check-then-write window."""
    from moto import server

    _pause_between_check_and_write()
    server.main(sys.argv[1:])


if __name__ == "__main__":
    main()
