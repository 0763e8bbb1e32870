"""The few raw S3 calls the lake needs beyond fsspec and deltalake: the bucket probe, and listing and
aborting the multipart uploads a crashed writer left behind (vacuum does not see them: they are not
objects yet). Through s3fs's public ``call_s3``; nothing here touches s3fs internals.
"""

from __future__ import annotations

from typing import Any

S3_PROTOCOLS = ("s3", "s3a")
#: Multipart part size of data-file uploads (S3's minimum is 5 MiB): what one upload holds in memory.
UPLOAD_PART_BYTES = 8 * 2**20


def is_s3(protocol: str) -> bool:
    return protocol in S3_PROTOCOLS


def can_call(fs: Any, protocol: str) -> bool:
    """Whether ``fs`` is an s3fs filesystem whose raw S3 calls (``call_s3``) are available."""
    return is_s3(protocol) and hasattr(fs, "call_s3")


def head_bucket(fs: Any, bucket: str) -> None:
    fs.call_s3("head_bucket", Bucket=bucket)


def list_uploads(fs: Any, bucket: str, prefix: str) -> list[dict]:
    """Multipart uploads in progress under ``prefix`` (``Key``, ``UploadId``, ...)."""
    return fs.call_s3("list_multipart_uploads", Bucket=bucket, Prefix=prefix).get("Uploads", [])


def abort_upload(fs: Any, bucket: str, key: str, upload_id: str) -> None:
    fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload_id)
