"""A single-node Ceph cluster with its RADOS Gateway: a real S3 server for the tests, on 127.0.0.1.

The recipe is the one in ``docs/s3-servers.md`` (Ceph 16.2.15, Debian 12's packages): one monitor (msgr2
only), one OSD on memstore (its objects live in RAM), no manager, and ``radosgw`` with the beast frontend.
Every daemon binds 127.0.0.1 only, on ports picked free; each daemonizes and writes a pid file, and
:func:`serve_rgw` stops them by those PIDs (SIGKILL: the cluster's data is thrown away with its folder).
Their logs stay in the folder and are quoted when the start fails. About 5 to 6 s from nothing to the first
signed request, about 125 MB of RAM when idle.

One user, ``ckpt``, holds every access key the tests sign with (:data:`ACCESS_KEYS`): buckets created under
one key are used under another, as on moto, but here a key nobody registered is refused (RGW checks SigV4).

Nothing here downloads anything: the binaries come from the system's packages (``.ci/run`` installs them).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs

from support.s3 import free_port

# The binaries the recipe runs. `ceph` is the Python CLI (about 0.3 s a call).
BINARIES = ("ceph-authtool", "monmaptool", "ceph-mon", "ceph-osd", "ceph", "radosgw", "radosgw-admin")
INSTALL_HINT = (
    "install Ceph's RADOS Gateway (Debian 12: `apt-get install --no-install-recommends radosgw ceph-mon "
    "ceph-osd`, as .ci/run does)"
)
# The user's first key, then every other key a test signs with (moto accepts any; RGW only these).
ACCESS_KEYS: dict[str, str] = {
    "testing": "testing",
    "x": "y",
    "probe-test-key": "probe-test-secret",
    "cli-test-key": "cli-test-secret-value",
    "resume-key": "resume-secret",
    "AKIDPLATFORM": "platform-secret-never-shown",
    "AKIAFAULTINJECTION": "secret-key-never-shown",
    "AKIDVIAPROXY": "sk",
}
USER = "ckpt"
# The KMS key id the gateway knows (its 256-bit key, base64, is in ceph.conf only), and a storage class
# added to the default placement beside STANDARD (a pool of its own): what the bucket-settings tests ask for.
KMS_KEY_ID = "ckpt-test-key"
_KMS_KEY = "Y2twdC10ZXN0LWttcy1rZXktMzItYnl0ZXMtbG9uZyE="
STORAGE_CLASS = "COLD"
HOST_NAMES = ("localhost", "unresolvable-s3", "s3-only-via-proxy", "s3.unresolvable.test", "s3.internal.test")
_START_SECONDS = 90.0
MEMSTORE_BYTES = 4 << 30  # the OSD's RAM for objects: the tests hold far less
_COMMAND_SECONDS = 60.0  # radosgw-admin hangs, rather than fails, on a cluster whose PGs never go active

_CONF = """\
[global]
fsid = {fsid}
mon host = [v2:127.0.0.1:{mon_port}]
ms bind msgr1 = false
ms bind ipv6 = false
public addr = 127.0.0.1
cluster addr = 127.0.0.1
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
keyring = {d}/keyring
run dir = {d}/run
admin socket = {d}/run/$name.asok
log file = {d}/log/$name.log
pid file = {d}/run/$name.pid
crash dir = {d}/crash
osd pool default size = 1
osd pool default min size = 1
mon allow pool size one = true
mon warn on pool no redundancy = false
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
mon max pg per osd = 1000
osd crush chooseleaf type = 0
paxos propose interval = 0.05
paxos min wait = 0.01

[mon]
mon data = {d}/mon/$cluster-$id

[osd]
osd data = {d}/osd/$cluster-$id
keyring = $osd_data/keyring
osd objectstore = memstore
memstore device bytes = {memstore_bytes}

[client.rgw.a]
# tcp_nodelay=1: without it the answer to a small request waits for the client's delayed ACK (Nagle's
# algorithm on the server's split writes): a PutObject took 44 ms instead of 2 ms (docs/s3-servers.md).
rgw frontends = beast endpoint=127.0.0.1:{rgw_port}{frontend_options}
rgw data = {d}/rgw
rgw dns name = localhost
# SSE-KMS with keys from this file (Pacific's test backend; no SSE-S3 exists in 16.2), over plain HTTP on
# loopback (RGW refuses encryption headers without TLS otherwise). Harmless to requests without them.
rgw crypt s3 kms backend = testing
rgw crypt s3 kms encryption keys = {kms_key_id}={kms_key}
rgw crypt require ssl = false
"""


def missing_binaries() -> list[str]:
    """Return the recipe's binaries that are not on PATH (empty when RGW can be started)."""
    return [name for name in BINARIES if shutil.which(name) is None]


class RgwStartError(RuntimeError):
    """The cluster did not come up; the message quotes the failing command and the daemons' logs."""


@attrs.frozen(slots=True)
class RgwServer:
    """A running RADOS Gateway: its endpoint, the main key pair, and the cluster's folder (for the admin)."""

    endpoint: str
    access_key: str
    secret_key: str
    folder: Path = attrs.field(repr=False)

    def admin(self, *args: str) -> str:
        """Run ``radosgw-admin`` on this cluster; return its output (raises with the output on failure)."""
        return _run(self.folder, "radosgw-admin", "-c", str(self.folder / "ceph.conf"), *args)

    def add_key(self, access_key: str, secret_key: str) -> None:
        """Give the user another S3 key pair."""
        self.admin("key", "create", f"--uid={USER}", "--key-type=s3",
                   f"--access-key={access_key}", f"--secret-key={secret_key}")  # fmt: skip

    def remove_key(self, access_key: str) -> None:
        """Revoke an S3 key of the user: a request signed with it gets 403 ``InvalidAccessKeyId``."""
        self.admin("key", "rm", f"--uid={USER}", "--key-type=s3", f"--access-key={access_key}")


def _logs(folder: Path) -> str:
    parts = []
    for log in sorted((folder / "log").glob("*.log")) + sorted(folder.glob("*.out")):
        tail = log.read_text(errors="replace")[-1500:]
        parts.append(f"--- {log.name} (last 1500 characters) ---\n{tail}")
    return "\n".join(parts)


def _run(folder: Path, *command: str, timeout: float = _COMMAND_SECONDS) -> str:
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise RgwStartError(f"{' '.join(command[:4])} ... hung for {timeout}s\n{_logs(folder)}") from exc
    if result.returncode != 0:
        output = f"{result.stdout}{result.stderr}\n{_logs(folder)}"
        raise RgwStartError(f"{' '.join(command)} exited with {result.returncode}:\n{output}")
    return result.stdout


def _poll(what: str, folder: Path, daemons: list[subprocess.Popen[bytes]], ready: Callable[[], bool]) -> None:
    deadline = time.monotonic() + _START_SECONDS
    while time.monotonic() < deadline:
        exited = [" ".join(map(str, p.args[:1])) for p in daemons if p.poll() is not None]  # type: ignore[index]
        if exited:
            raise RgwStartError(f"{what}: {', '.join(exited)} exited\n{_logs(folder)}")
        if ready():
            return
        time.sleep(0.1)  # polling a daemon's readiness, as serve_moto does; never a wait for a result
    raise RgwStartError(f"{what} within {_START_SECONDS}s\n{_logs(folder)}")


def _answers(url: str) -> bool:
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through an env proxy
    try:
        with direct.open(url, timeout=1) as answer:  # 127.0.0.1 only
            answer.read()
    except urllib.error.HTTPError:
        return True  # any HTTP answer (403 to an anonymous request) means it is serving
    except OSError:
        return False
    return True


def _daemon(folder: Path, daemons: list[subprocess.Popen[bytes]], name: str, *command: str) -> None:
    """Start a daemon in the foreground (``-f``) as our child, its output in ``<folder>/<name>.out``."""
    with (folder / f"{name}.out").open("wb") as out:
        daemons.append(subprocess.Popen([*command, "-f"], stdout=out, stderr=subprocess.STDOUT))


def _stop(daemons: list[subprocess.Popen[bytes]]) -> None:
    """SIGKILL every daemon by its PID, newest first, and reap it (the data goes with the folder)."""
    for process in reversed(daemons):
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)
    for process in daemons:
        process.wait(timeout=30)


def start(
    folder: Path,
    daemons: list[subprocess.Popen[bytes]],
    *,
    tcp_nodelay: bool = True,
    memstore_bytes: int = MEMSTORE_BYTES,
) -> RgwServer:
    """Create and start the cluster in the empty ``folder``; return the gateway, answering requests.

    Each daemon started is appended to ``daemons``. :class:`RgwStartError` quotes the logs on failure.
    ``tcp_nodelay=False`` leaves the frontend's default (Nagle on), for the benchmark that shows its cost;
    ``memstore_bytes`` is the RAM the OSD may fill with objects (a benchmark's 8 GiB set needs more).
    """
    missing = missing_binaries()
    if missing:
        raise RgwStartError(f"the RGW test tier needs {', '.join(missing)}: {INSTALL_HINT}")
    for sub in ("run", "log", "crash", "mon", "osd/ceph-0", "rgw"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    conf, keyring = str(folder / "ceph.conf"), str(folder / "keyring")
    mon_port, rgw_port = free_port(), free_port()
    fsid = str(uuid.uuid4())
    Path(conf).write_text(
        _CONF.format(
            fsid=fsid,
            mon_port=mon_port,
            rgw_port=rgw_port,
            frontend_options=" tcp_nodelay=1" if tcp_nodelay else "",
            memstore_bytes=memstore_bytes,
            d=folder,
            kms_key_id=KMS_KEY_ID,
            kms_key=_KMS_KEY,
        )
    )
    _run(folder, "ceph-authtool", "--create-keyring", keyring,
         "--gen-key", "-n", "mon.", "--cap", "mon", "allow *")  # fmt: skip
    _run(folder, "ceph-authtool", keyring, "--gen-key", "-n", "client.admin",
         "--cap", "mon", "allow *", "--cap", "osd", "allow *", "--cap", "mgr", "allow *")  # fmt: skip
    _run(folder, "ceph-authtool", keyring, "--gen-key", "-n", "client.rgw.a",
         "--cap", "mon", "allow rw", "--cap", "osd", "allow rwx", "--cap", "mgr", "allow rw")  # fmt: skip
    monmap = str(folder / "monmap")
    _run(folder, "monmaptool", "--create", "--fsid", fsid,
         "--addv", "a", f"[v2:127.0.0.1:{mon_port}]", monmap)  # fmt: skip
    _run(folder, "ceph-mon", "-c", conf, "--mkfs", "-i", "a", "--monmap", monmap, "--keyring", keyring)
    _daemon(folder, daemons, "mon.a", "ceph-mon", "-c", conf, "-i", "a")
    osd_uuid = str(uuid.uuid4())
    osd_id = _run(folder, "ceph", "-c", conf, "osd", "new", osd_uuid).strip()
    _run(folder, "ceph-osd", "-c", conf, "-i", osd_id, "--mkfs", "--mkkey", "--no-mon-config",
         "--osd-uuid", osd_uuid)  # fmt: skip
    _run(folder, "ceph", "-c", conf, "auth", "add", f"osd.{osd_id}", "osd", "allow *",
         "mon", "allow profile osd", "mgr", "allow profile osd",
         "-i", str(folder / "osd" / f"ceph-{osd_id}" / "keyring"))  # fmt: skip
    _daemon(folder, daemons, f"osd.{osd_id}", "ceph-osd", "-c", conf, "-i", osd_id)

    def osd_up() -> bool:
        dump = _run(folder, "ceph", "-c", conf, "osd", "dump")
        return any(line.startswith(f"osd.{osd_id} up") for line in dump.splitlines())

    _poll("the OSD did not come up", folder, daemons, osd_up)
    keys = iter(ACCESS_KEYS.items())
    access_key, secret_key = next(keys)
    _run(folder, "radosgw-admin", "-c", conf, "user", "create", f"--uid={USER}", f"--display-name={USER}",
         f"--access-key={access_key}", f"--secret-key={secret_key}", "--max-buckets=0")  # fmt: skip
    server = RgwServer(f"http://127.0.0.1:{rgw_port}", access_key, secret_key, folder)
    for other, secret in keys:
        server.add_key(other, secret)
    # Once any host name is configured RGW takes a Host that is neither an IP nor a listed name for a bucket
    # (CNAME style): list the names the tests reach it by through the forward-proxy double.
    zonegroup = json.loads(server.admin("zonegroup", "get"))
    zonegroup["hostnames"] = list(HOST_NAMES)
    (folder / "zonegroup.json").write_text(json.dumps(zonegroup))
    server.admin("zonegroup", "set", "--infile", str(folder / "zonegroup.json"))
    placement = ("--placement-id=default-placement", f"--storage-class={STORAGE_CLASS}")
    server.admin("zonegroup", "placement", "add", "--rgw-zonegroup=default", *placement)
    pool = f"--data-pool=default.rgw.{STORAGE_CLASS.lower()}.data"
    server.admin("zone", "placement", "add", "--rgw-zone=default", *placement, pool)
    _daemon(folder, daemons, "client.rgw.a", "radosgw", "-c", conf, "-n", "client.rgw.a")
    root_url = f"{server.endpoint}/"
    _poll(f"radosgw did not answer at {root_url}", folder, daemons, lambda: _answers(root_url))
    return server


@contextlib.contextmanager
def serve_rgw(
    folder: Path, *, tcp_nodelay: bool = True, memstore_bytes: int = MEMSTORE_BYTES
) -> Iterator[RgwServer]:
    """Run a cluster in ``folder`` (created empty) until the ``with`` ends; yield its gateway."""
    daemons: list[subprocess.Popen[bytes]] = []
    try:
        yield start(folder, daemons, tcp_nodelay=tcp_nodelay, memstore_bytes=memstore_bytes)
    finally:
        _stop(daemons)
