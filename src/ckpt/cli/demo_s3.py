"""``ckpt demo --s3``: the demo's story against an S3 server embedded in the process (moto), on loopback.

No cloud account and no network: moto's server listens on 127.0.0.1, accepts any keys, and honours
``If-None-Match: *`` like S3. The store is built exactly as for a real bucket (``open_s3_store`` with a
configuration and an environment), so this exercises the real S3 adapter end to end.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from ckpt.domain.errors import InvalidError

if TYPE_CHECKING:
    from ckpt.cli import Context
    from ckpt.cli.demo import MakeSave
    from ckpt.domain.ports import WatchStore

__all__ = ["run_s3_demo"]

BUCKET = "ckpt-demo"
ROOT = f"s3://{BUCKET}/team-a/run-42"
# moto accepts any keys; the env credential source reads them from this mapping, not from os.environ.
DEMO_ENV = {"AWS_ACCESS_KEY_ID": "demo-access-key", "AWS_SECRET_ACCESS_KEY": "demo-secret-key"}

Tell = Callable[["Context", "WatchStore", "MakeSave", str], int]


def run_s3_demo(ctx: Context, tell: Tell) -> int:
    """Start moto's server on loopback, tell the story on an ``s3://`` root in it, stop the server."""
    try:
        from moto.server import ThreadedMotoServer
    except ImportError:
        raise InvalidError(
            "ckpt demo --s3 needs moto's server: pip install 'ckpt-log[demo-s3]'"
            " (python3 dev.py demo --s3 installs it)"
        ) from None
    from ckpt.adapters.s3 import make_s3_client, open_s3_store
    from ckpt.config import Config, S3Settings

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's request log would drown the story
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        settings = S3Settings(endpoint_url=endpoint, region="us-east-1", addressing_style="path")
        config = Config(s3=settings, credentials=({"source": "env"},))
        client = make_s3_client(config, DEMO_ENV)
        client.create_bucket(Bucket=BUCKET)

        def make_save(location: str, files: dict[str, bytes]) -> None:
            prefix = location.removeprefix(f"s3://{BUCKET}/")
            for name, data in files.items():
                client.put_object(Bucket=BUCKET, Key=f"{prefix}/{name}", Body=data)

        store = open_s3_store(ROOT, config=config, environ=DEMO_ENV)
        return tell(ctx, store, make_save, f"{ROOT} (moto's S3 server on {host}:{port})")
    finally:
        server.stop()
