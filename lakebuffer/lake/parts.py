"""``LakeParts``: what the functions over a lake (snapshot commit, maintenance) need of it.

A protocol rather than an import of ``Lake``: those modules sit below ``table`` (which composes them),
so they name the parts they use instead of the class that uses them.
"""

from __future__ import annotations

from typing import Protocol

import pyarrow as pa

from .claims import WriterClaims
from .delta import DeltaLog
from .fs import LakeFS
from .options import LakeOptions


class LakeParts(Protocol):
    """The public parts of a ``Lake`` its commit and maintenance functions use."""

    store: LakeFS
    delta: DeltaLog
    claims: WriterClaims
    options: LakeOptions
    policy_bucket_size: int

    @property
    def url(self) -> str: ...

    def runs(self) -> list[str]: ...

    def schema(self, run_id: str | None = None) -> pa.Schema: ...
