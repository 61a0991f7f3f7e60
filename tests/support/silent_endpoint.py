"""An HTTP endpoint on 127.0.0.1 that accepts connections and never answers: a store gone silent."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["silent_endpoint", "silent_s3_config"]


@contextmanager
def silent_endpoint() -> Iterator[tuple[str, list[socket.socket]]]:
    """Yield ``(url, held)``: the endpoint's URL and the connections it accepted (and never answered)."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.05)
    held: list[socket.socket] = []
    closing = threading.Event()

    def accept() -> None:
        while not closing.is_set():
            try:
                held.append(listener.accept()[0])
            except TimeoutError:
                continue

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", held
    finally:
        closing.set()
        acceptor.join(5)
        listener.close()
        for conn in held:
            conn.close()


def silent_s3_config(path: Path, url: str) -> Path:
    """Write a configuration file whose S3 endpoint is ``url`` with long timeouts and retries; return it."""
    path.write_text(
        f'[s3]\nendpoint_url = "{url}"\nregion = "us-east-1"\n'
        'addressing_style = "path"\nread_timeout = 60\nmax_attempts = 3\n',
        encoding="utf-8",
    )
    return path
