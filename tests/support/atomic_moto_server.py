"""moto's S3 server with ``PutObject`` made atomic, as S3 makes it.

Run from ``tests/`` as ``python -m support.atomic_moto_server -H 127.0.0.1 -p PORT``.

Why: moto's server is threaded, and its conditional ``PutObject`` checks ``If-None-Match: *`` against the
key and only then stores the object, with other requests free to run in between. Two racing conditional puts
of one key can therefore both succeed on moto, which S3 never allows ("the first write to finish succeeds,
the others get 412 or 409"). The race tests hold ``ckpt`` to S3's contract, so they need a double that keeps
it: this one runs each ``PutObject`` (check and write) under one lock, and changes nothing else.
"""

from __future__ import annotations

import sys
import threading
from typing import Any


def _serialize_put_object() -> None:
    from moto.s3.responses import S3Response

    lock = threading.Lock()
    put_object = S3Response.put_object

    def atomic_put_object(self: Any) -> Any:
        with lock:
            return put_object(self)

    S3Response.put_object = atomic_put_object  # type: ignore[method-assign]


def main() -> None:
    """Start moto's server (same arguments as ``python -m moto.server``) with atomic conditional puts."""
    from moto import server

    _serialize_put_object()
    server.main(sys.argv[1:])


if __name__ == "__main__":
    main()
