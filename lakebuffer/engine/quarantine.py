"""The quarantine folder ``<dir>/quarantine/``: local files recovery or fsck moved aside.

Recovery never deletes what it cannot explain: a WAL segment no index entry refers to, a segment
that fails its check, or a damaged index is moved here instead, kept, never served. Each move is
recorded with its reason in ``quarantine/log.jsonl`` so ``fsck`` can list what is here, why, and
how to dispose of it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

QUARANTINE = "quarantine"
LOG = "log.jsonl"

HOW_TO_DISPOSE = (
    "quarantined files are never read by the buffer. WAL segments and warm fragments (*.arrow) are Arrow IPC "
    "files followed by a checksum footer: inspect one with pyarrow.ipc.open_file(path, "
    "footer_offset=lakebuffer.tiers.segfooter.ipc_end(path)).read_all() and push again any rows you still want (a segment "
    "no index entry refers to holds a push that crashed before it was acknowledged; a warm fragment there "
    "failed its checksum, so check its rows before trusting them); a damaged index "
    "(index.damaged-*) is only kept for diagnosis. Delete {folder} once you no longer need them."
)


def folder(buffer_dir: Path) -> Path:
    return Path(buffer_dir) / QUARANTINE


def move(src: Path, buffer_dir: Path, kind: str, why: str, name: str | None = None) -> Path:
    """Move file or directory ``src`` into ``<dir>/quarantine/<kind>/`` (as ``name``, default its
    own; never overwriting) and record why; the new path."""
    dest = folder(buffer_dir) / kind
    dest.mkdir(parents=True, exist_ok=True)
    src = Path(src)
    base = Path(name or src.name)
    target = dest / base.name
    n = 0
    while target.exists():
        n += 1
        target = dest / f"{base.stem}.{n}{base.suffix}"
    os.replace(src, target)
    record = {"path": str(target.relative_to(folder(buffer_dir))), "from": str(src), "why": why,
              "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    with open(folder(buffer_dir) / LOG, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())
    return target


def _size(p: Path) -> int:
    if p.is_dir():
        return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
    return p.stat().st_size


def listing(buffer_dir: Path) -> list[dict[str, Any]]:
    """What is in quarantine: ``{"path", "bytes", "why", "at"}`` per file (or damaged index folder);
    ``why`` is None for an entry the log does not explain (moved by hand, or before the log existed)."""
    root = folder(buffer_dir)
    if not root.is_dir():
        return []
    reasons: dict[str, dict] = {}
    log_file = root / LOG
    if log_file.is_file():
        for line in log_file.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                rec = json.loads(line)
                reasons[rec["path"]] = rec
            except (ValueError, KeyError, TypeError):
                continue  # a torn last line: its entry is listed without a reason
    out = []
    for kind in sorted(p for p in root.iterdir() if p.is_dir()):
        for entry in sorted(kind.iterdir()):
            rel = str(entry.relative_to(root))
            rec = reasons.get(rel, {})
            out.append({"path": str(entry), "bytes": _size(entry), "why": rec.get("why"), "at": rec.get("at")})
    return out


def how_to_dispose(buffer_dir: Path) -> str:
    return HOW_TO_DISPOSE.format(folder=folder(buffer_dir))
