"""Small result objects returned instead of raw dicts (``Snapshot``).

A snapshot's manifest is kilobytes of file lists and a base64 schema: what a caller wants back from
``snapshot(wait=True)`` is which commit it was and how much the run holds. A frozen dataclass says
that in its repr; ``s["snapshot_id"]`` keeps working for code written against the manifest dict.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass(frozen=True)
class Snapshot:
    """One committed lake snapshot of a run (totals are the run's, as of this commit; ``rows`` are
    live rows: Delta deletes rewrite files, so no file row is hidden; ``deleted_keys`` is how many keys
    this snapshot deleted)."""

    snapshot_id: int
    run_id: str
    lake: str
    rows: int
    files: int
    bytes: int
    added_files: int
    deleted_keys: int
    created_at: str | None = None

    @classmethod
    def from_manifest(cls, manifest: dict[str, Any], lake: str) -> Snapshot:
        summary = manifest.get("summary", {})
        return cls(
            snapshot_id=int(manifest["snapshot_id"]), run_id=str(manifest["run_id"]), lake=lake,
            rows=int(summary.get("rows", 0)), files=int(summary.get("files", 0)), bytes=int(summary.get("bytes", 0)),
            added_files=len(manifest.get("added_files", [])), deleted_keys=int(summary.get("deleted_keys", 0)),
            created_at=manifest.get("created_at"),
        )

    def __getitem__(self, name: str) -> Any:
        """Dict-style access (``s["snapshot_id"]``), as when ``snapshot`` returned the manifest."""
        if name not in {f.name for f in fields(self)}:
            raise KeyError(name)
        return getattr(self, name)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
