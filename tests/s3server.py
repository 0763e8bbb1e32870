"""A real S3 HTTP server on 127.0.0.1 for tests: moto in server mode, in a subprocess.

Load it as a pytest plugin (``pytest_plugins = ["tests.s3server"]``). Fixtures:

* ``s3_server`` (session): starts ``python -m moto.server`` on a free loopback port behind a tiny TCP
  relay on another free port, waits until it answers, sets fake ``AWS_*`` variables so nothing can
  reach real AWS, and stops the moto process by PID at the end. The object it yields has
  ``endpoint_url`` (the relay), ``direct_endpoint_url`` (moto itself, for benchmarks that should not
  pay for the relay), ``storage_options`` (for s3fs / ``Lake`` / ``ReplayBuffer``), ``client()``
  (boto3), and ``stop()`` / ``start()`` to simulate an S3 outage on the same port.

  Why a relay: moto keeps its objects in the memory of its process, so killing and restarting it
  loses every bucket and a "retry after the outage" test could never pass. ``stop()`` closes the
  relay's listening socket and resets every open connection (clients get ``connection refused``
  exactly as with a dead server), while the moto process and its data survive; ``start()`` listens
  on the same port again. ``kill()`` / ``restart()`` really end and restart the moto process (all
  data lost), and ``pause()`` / ``resume()`` send SIGSTOP / SIGCONT (requests hang until timeouts).
* ``s3_bucket`` (function): a fresh, uniquely named bucket (us-east-1) as ``"s3://<bucket>"``;
  emptied and removed afterwards. It makes sure the server is reachable first, in case an earlier
  test left it stopped.

Only 127.0.0.1 is ever used; ``moto.mock_aws`` is never used.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator

import pytest

HOST = "127.0.0.1"
REGION = "us-east-1"
KEY = "testing"
SECRET = "testing"

FAKE_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": KEY,
    "AWS_SECRET_ACCESS_KEY": SECRET,
    "AWS_SESSION_TOKEN": "testing",
    "AWS_SECURITY_TOKEN": "testing",
    "AWS_DEFAULT_REGION": REGION,
    "AWS_REGION": REGION,
    "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
}


def _terminate(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL if it has not ended within 10 s."""
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class _Relay:
    """Forward TCP connections from ``HOST:port`` to ``HOST:target_port``; can be cut and restored."""

    def __init__(self, port: int, target_port: int) -> None:
        self.port = port
        self.target_port = target_port
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()

    @property
    def running(self) -> bool:
        return self._listener is not None

    def start(self) -> None:
        if self._listener is not None:
            return
        ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        deadline = time.monotonic() + 10
        while True:
            try:
                ls.bind((HOST, self.port))
                break
            except OSError:
                if time.monotonic() > deadline:
                    ls.close()
                    raise
                time.sleep(0.05)
        ls.listen(128)
        ls.settimeout(0.05)
        self._stop.clear()
        self._listener = ls
        self._thread = threading.Thread(target=self._accept_loop, args=(ls,), name="s3-relay", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Refuse new connections and reset the open ones (a dead server, as seen by clients)."""
        ls, self._listener = self._listener, None
        if ls is None:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        ls.close()
        with self._lock:
            conns, self._conns = self._conns, set()
        for c in conns:
            with contextlib.suppress(OSError):
                # linger 0: close sends RST, so a client blocked mid-request fails at once
                c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                c.close()

    def _accept_loop(self, ls: socket.socket) -> None:
        while not self._stop.is_set():
            try:
                client, _ = ls.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            try:
                upstream = socket.create_connection((HOST, self.target_port), timeout=10)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            for s in (client, upstream):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                if self._stop.is_set():
                    client.close()
                    upstream.close()
                    return
                self._conns.update((client, upstream))
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), name="s3-relay-pump", daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        buf = bytearray(1 << 20)
        view = memoryview(buf)
        try:
            while True:
                n = src.recv_into(buf)
                if not n:
                    break
                dst.sendall(view[:n])
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)
            with self._lock:
                self._conns.discard(src)
            with contextlib.suppress(OSError):
                src.close()



def serve_relay(port: int, target_port: int) -> None:
    """Run a ``_Relay`` until SIGTERM (then reset its connections, like ``_Relay.stop``) - the body of
    ``_RelayProcess``'s child."""
    relay = _Relay(port, target_port)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    relay.start()
    print("ready", flush=True)
    done.wait()
    relay.stop()
    os._exit(0)


class _RelayProcess:
    """A ``_Relay`` in a child process, with the same ``start``/``stop``/``running``.

    Why a process: deltalake (delta-rs) holds the GIL during some calls that do S3 I/O (e.g.
    ``DeltaTable.history``), so a relay thread in the test process could never forward the request
    that call is waiting for (a deadlock until the client's timeout). A real endpoint is another
    process too."""

    def __init__(self, port: int, target_port: int) -> None:
        self.port = port
        self.target_port = target_port
        self.proc: subprocess.Popen | None = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        if self.running:
            return
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        code = f"from tests.s3server import serve_relay; serve_relay({self.port}, {self.target_port})"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code], cwd=root, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, start_new_session=True
        )
        line = self.proc.stdout.readline()
        if line.strip() != b"ready":
            self.stop()
            raise RuntimeError(f"the S3 relay did not start: {line!r}")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            _terminate(proc)
        if proc.stdout is not None:
            proc.stdout.close()

class S3Server:
    """A moto S3 server subprocess on 127.0.0.1 behind a relay that tests can cut (``stop``/``start``)."""

    def __init__(self, log_dir: str) -> None:
        self.host = HOST
        self.port = free_port()
        self.moto_port = free_port()
        while self.moto_port == self.port:
            self.moto_port = free_port()
        self.region = REGION
        self.log_path = os.path.join(log_dir, f"moto-{self.moto_port}.log")
        self.process: subprocess.Popen | None = None
        self._relay = _RelayProcess(self.port, self.moto_port)

    # -- addresses -------------------------------------------------------------------------
    @property
    def endpoint_url(self) -> str:
        """The endpoint tests use: the relay, so ``stop()`` cuts it."""
        return f"http://{HOST}:{self.port}"

    @property
    def direct_endpoint_url(self) -> str:
        """moto itself, without the relay (benchmarks); not affected by ``stop()``."""
        return f"http://{HOST}:{self.moto_port}"

    def storage_options_for(self, endpoint_url: str) -> dict:
        return {
            "endpoint_url": endpoint_url,
            "key": KEY,
            "secret": SECRET,
            "client_kwargs": {"region_name": REGION},
            # fail fast in outage tests instead of retrying for a minute
            "config_kwargs": {
                "connect_timeout": 2,
                "read_timeout": 30,
                "retries": {"max_attempts": 2, "mode": "standard"},
            },
        }

    @property
    def storage_options(self) -> dict:
        """fsspec/s3fs options for this server (a fresh dict each time, safe to modify)."""
        return self.storage_options_for(self.endpoint_url)

    @property
    def direct_storage_options(self) -> dict:
        return self.storage_options_for(self.direct_endpoint_url)

    def client(self, direct: bool = False):
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.direct_endpoint_url if direct else self.endpoint_url,
            aws_access_key_id=KEY,
            aws_secret_access_key=SECRET,
            region_name=REGION,
            config=Config(connect_timeout=2, read_timeout=30, retries={"max_attempts": 2, "mode": "standard"}),
        )

    # -- lifecycle -------------------------------------------------------------------------
    def launch(self, timeout_s: float = 60) -> None:
        """Start the moto process (if not running) and the relay, and wait until S3 answers."""
        if self.process is None or self.process.poll() is not None:
            env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
            env.update(FAKE_AWS_ENV)
            log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child, closed below
            try:
                self.process = subprocess.Popen(
                    [sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(self.moto_port)],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                )
            finally:
                log.close()
            self._wait_ready(self.direct_endpoint_url, timeout_s)
        self.start()

    def _wait_ready(self, url: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"moto server exited with {self.process.returncode}:\n{self._log_tail()}")
            try:
                with urllib.request.urlopen(url + "/moto-api/", timeout=2):
                    return
            except urllib.error.HTTPError:
                return  # it answered
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"moto server did not answer on {url} in {timeout_s}s:\n{self._log_tail()}") from None
                time.sleep(0.1)

    def _log_tail(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-4000:].decode(errors="replace")
        except OSError:
            return ""

    def start(self) -> None:
        """Make the endpoint reachable again (same port) after ``stop()``."""
        if self.process is None or self.process.poll() is not None:
            raise RuntimeError("the moto process is not running; use restart()")
        self._relay.start()

    def stop(self) -> None:
        """Simulate an outage: the endpoint refuses connections, open ones are reset; data survives."""
        self._relay.stop()

    @property
    def running(self) -> bool:
        return self._relay.running and self.process is not None and self.process.poll() is None

    @contextlib.contextmanager
    def outage(self) -> Iterator[None]:
        self.stop()
        try:
            yield
        finally:
            self.start()

    def pause(self) -> None:
        """SIGSTOP the moto process: connections are accepted but nothing answers (timeouts)."""
        if self.process is not None:
            os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.process is not None:
            os.kill(self.process.pid, signal.SIGCONT)

    def kill(self) -> None:
        """End the relay and the moto process (by PID); every bucket is lost."""
        self._relay.stop()
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGCONT)
        _terminate(proc)

    def restart(self) -> None:
        """A real restart of the moto process on the same ports (all data lost)."""
        self.kill()
        self.launch()

    # -- buckets ---------------------------------------------------------------------------
    def make_bucket(self, name: str | None = None) -> str:
        name = name or f"test-{uuid.uuid4().hex[:16]}"
        self.client().create_bucket(Bucket=name)
        return f"s3://{name}"

    def remove_bucket(self, name: str) -> None:
        s3 = self.client()
        paginator = s3.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=name):
            objs = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if objs:
                s3.delete_objects(Bucket=name, Delete={"Objects": objs, "Quiet": True})
        for up in s3.list_multipart_uploads(Bucket=name).get("Uploads", []):
            s3.abort_multipart_upload(Bucket=name, Key=up["Key"], UploadId=up["UploadId"])
        s3.delete_bucket(Bucket=name)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    with pytest.MonkeyPatch.context() as mp:
        for k in [k for k in os.environ if k.startswith("AWS_")]:
            mp.delenv(k)
        for k, v in FAKE_AWS_ENV.items():
            mp.setenv(k, v)
        with tempfile.TemporaryDirectory(prefix="lakebuffer-moto-") as log_dir:
            server = S3Server(log_dir)
            try:
                server.launch()
                # boto3 clients created without an endpoint go to moto, never to AWS
                mp.setenv("AWS_ENDPOINT_URL", server.endpoint_url)
                yield server
            finally:
                server.kill()


@pytest.fixture
def s3_bucket(s3_server: S3Server) -> Iterator[str]:
    s3_server.resume()
    if not s3_server.running:
        s3_server.launch()
    url = s3_server.make_bucket()
    try:
        yield url
    finally:
        s3_server.resume()
        if not s3_server.running:
            s3_server.launch()
        with contextlib.suppress(Exception):
            s3_server.remove_bucket(url[len("s3://") :])
