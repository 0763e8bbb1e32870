"""Whether a lake URL names a place that exists: a typo in a URL must not read as an empty lake, and a
writer must not create a lake (and its parents) somewhere nobody asked for.

Readers (``ReplayBuffer.open_lake``, ``lakebuffer sql/stats/fsck LAKE``) need the URL to exist: a local
directory, or on an object store a bucket holding objects under the prefix (S3 has no empty folders).
Writers (``ReplayBuffer.open(lake=...)``) may name a lake that does not exist yet, but only under an
existing location: locally its parent directory must exist (or ``create_lake=True`` makes it); on an
object store the bucket must exist (``LakeFS.probe``) and any prefix in it is an existing location.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ..errors import LakeError

if TYPE_CHECKING:
    from .table import Lake


def _exists(lake: Lake, path: str) -> bool:
    return bool(lake.store.io(f"checking that {path} exists", lake.store.fs.exists, path))


def require_existing(lake: Lake) -> None:
    """``LakeError`` unless the lake's URL exists (a reader's check)."""
    if _exists(lake, lake.store.root):
        return
    what = "directory" if lake.store.local else "prefix (no object under it)"
    raise LakeError(
        f"lake {lake.url} does not exist (no such {what}): check the URL; a lake is created by the first "
        "snapshot of a buffer opened with lake=<url>"
    )


def require_parent(lake: Lake, create: bool = False) -> None:
    """A writer's lake: ``LakeError`` when it does not exist and its local parent directory does not
    either, unless ``create``; otherwise the lake's directory is made now (a reader opening the lake
    before the first snapshot sees an empty lake, not a missing one). Object stores: nothing beyond the
    bucket probe ``Lake`` already did (a prefix in an existing bucket is an existing location)."""
    if not lake.store.local or _exists(lake, lake.store.root):
        return
    parent = os.path.dirname(lake.store.root.rstrip("/")) or "/"
    if create or os.path.isdir(parent):  # made now, so readers of the (empty) lake find it before a snapshot
        lake.store.io(f"creating {lake.store.root}", os.makedirs, lake.store.root, exist_ok=True)
        return
    raise LakeError(
        f"the parent directory {parent} of lake {lake.url} does not exist, so the lake would be created "
        "somewhere nobody made (a typo?): fix the lake URL, create the directory, or open with create_lake=True"
    )
