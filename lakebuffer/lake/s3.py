"""The one adapter around s3fs internals: a multipart writer with parts in flight, and the few raw S3
calls the lake needs (bucket probe, listing and aborting multipart uploads).

Why s3fs privates at all: s3fs's own file object uploads one part at a time and blocks the writer
meanwhile; queueing ``upload_part`` coroutines on s3fs's event loop (``fs._call_s3`` +
``fsspec.asyn.sync``) lets Parquet encoding overlap the upload. No other module of the lake touches
s3fs internals; the Delta Lake issue replaces this module together with the writer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import Any

import fsspec.asyn

from .layout import MiB

S3_PROTOCOLS = ("s3", "s3a")


def is_s3(protocol: str) -> bool:
    return protocol in S3_PROTOCOLS


def can_call(fs: Any, protocol: str) -> bool:
    """Whether ``fs`` is an s3fs filesystem whose raw S3 calls (``call_s3``) are available."""
    return is_s3(protocol) and hasattr(fs, "call_s3")


def can_multipart(fs: Any, protocol: str) -> bool:
    """Whether ``fs`` is an s3fs filesystem with an event loop that ``S3PartWriter`` can drive."""
    return is_s3(protocol) and hasattr(fs, "_call_s3") and getattr(fs, "loop", None) is not None


def head_bucket(fs: Any, bucket: str) -> None:
    fs.call_s3("head_bucket", Bucket=bucket)


def list_uploads(fs: Any, bucket: str, prefix: str) -> list[dict]:
    """Multipart uploads in progress under ``prefix`` (``Key``, ``UploadId``, ...)."""
    return fs.call_s3("list_multipart_uploads", Bucket=bucket, Prefix=prefix).get("Uploads", [])


def abort_upload(fs: Any, bucket: str, key: str, upload_id: str) -> None:
    fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload_id)


class S3PartWriter:
    """A write-only S3 object for s3fs with several multipart parts in flight: ``write`` queues a
    part upload on s3fs's event loop and returns, so the caller keeps encoding while S3 receives."""

    def __init__(self, fs: Any, path: str, *, part_bytes: int, max_inflight: int = 4) -> None:
        self.fs = fs
        self.bucket, self.key, _ = fs.split_path(path)
        self.part_bytes = max(int(part_bytes), 5 * MiB)
        self.max_inflight = max(1, int(max_inflight))
        self.chunks: list[Any] = []
        self.buffered = 0
        self.upload_id: str | None = None
        self.inflight: deque = deque()
        self.parts: list[dict] = []
        self.closed = False

    def _call(self, method: str, **kwargs: Any) -> Any:
        return fsspec.asyn.sync(self.fs.loop, self.fs._call_s3, method, **kwargs)

    def _submit(self, body: bytes) -> None:
        if self.upload_id is None:
            self.upload_id = self._call("create_multipart_upload", Bucket=self.bucket, Key=self.key)["UploadId"]
        number = len(self.parts) + len(self.inflight) + 1
        coro = self.fs._call_s3("upload_part", Bucket=self.bucket, Key=self.key, UploadId=self.upload_id, PartNumber=number, Body=body)
        self.inflight.append((number, asyncio.run_coroutine_threadsafe(coro, self.fs.loop)))
        while len(self.inflight) >= self.max_inflight:
            self._wait_one()

    def _wait_one(self) -> None:
        number, fut = self.inflight.popleft()
        self.parts.append({"PartNumber": number, "ETag": fut.result()["ETag"]})

    def _take(self) -> bytes:
        body = b"".join(self.chunks)
        self.chunks, self.buffered = [], 0
        return body

    def write(self, data: Any) -> int:
        self.chunks.append(data)
        self.buffered += len(data)
        if self.buffered >= self.part_bytes:
            self._submit(self._take())
        return len(data)

    def close(self) -> None:
        if self.closed:
            return
        if self.upload_id is None:
            self._call("put_object", Bucket=self.bucket, Key=self.key, Body=self._take())
        else:
            if self.buffered:
                self._submit(self._take())
            while self.inflight:
                self._wait_one()
            parts = sorted(self.parts, key=lambda p: p["PartNumber"])
            self._call(
                "complete_multipart_upload", Bucket=self.bucket, Key=self.key, UploadId=self.upload_id, MultipartUpload={"Parts": parts}
            )
        self.closed = True
        with contextlib.suppress(Exception):
            self.fs.invalidate_cache(f"{self.bucket}/{self.key}")

    def discard(self) -> None:
        self.closed = True
        self.chunks = []
        for _, fut in self.inflight:
            with contextlib.suppress(Exception):
                fut.result()
        self.inflight.clear()
        if self.upload_id is not None:
            with contextlib.suppress(Exception):
                self._call("abort_multipart_upload", Bucket=self.bucket, Key=self.key, UploadId=self.upload_id)
