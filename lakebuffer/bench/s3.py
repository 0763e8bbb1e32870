"""A loopback S3 server (moto in server mode) for the snapshot/restore and S3-limit measurements.

A real HTTP server on 127.0.0.1, started as a child process and stopped by its PID, so the bytes
go through s3fs, botocore and a socket exactly as they would against a remote store.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

BUCKET = "lakebuffer-bench"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MotoServer:
    """``with MotoServer() as s3: fs = s3.filesystem()``; one bucket, created on start."""

    def __init__(self, bucket: str = BUCKET, log_path: str | None = None) -> None:
        self.bucket = bucket
        self.log_path = log_path  # the server's request log (one line per request), to count requests
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._proc: subprocess.Popen | None = None

    @property
    def storage_options(self) -> dict[str, Any]:
        """What ``ReplayBuffer.open(..., storage_options=...)`` and ``s3fs.S3FileSystem(**...)`` take."""
        return {
            "key": "bench",
            "secret": "bench",
            "endpoint_url": self.endpoint,
            "client_kwargs": {"region_name": "us-east-1"},
        }

    def start(self, timeout_s: float = 30.0) -> MotoServer:
        env = dict(os.environ, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench")
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115 - the child holds it
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                stdout=subprocess.DEVNULL,
                stderr=log,
                env=env,
            )
        finally:
            if self.log_path:
                log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"moto server exited with code {self._proc.returncode}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        else:
            self.stop()
            raise RuntimeError("moto server did not start listening in time")
        try:
            import boto3

            boto3.client(
                "s3", endpoint_url=self.endpoint, aws_access_key_id="bench", aws_secret_access_key="bench", region_name="us-east-1"
            ).create_bucket(Bucket=self.bucket)
        except BaseException:
            self.stop()  # never leave a server behind when start fails half way
            raise
        return self

    def filesystem(self):
        """A fresh, uncached s3fs filesystem on this server."""
        import s3fs

        return s3fs.S3FileSystem(skip_instance_cache=True, use_listings_cache=False, **self.storage_options)

    def url(self, *parts: str) -> str:
        return "s3://" + "/".join([self.bucket, *parts])

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()

    def __enter__(self) -> MotoServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
