"""``ReplayBuffer.open_lake``: a read-only view over every run in a lake, for cross-run reuse.

The same ``sql``/``sample``/``get``/``scan`` as a live buffer, over the committed snapshots of all
runs (pinned when opened; ``refresh()`` to see newer ones). Replays are not counted here: the lake
is read-only, so ``max_reuse`` sees the counts as of each run's last snapshot.
"""

from __future__ import annotations

import html
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset  # noqa: F401 - pa.dataset in annotations

from . import display, predicate
from . import samplers as _samplers
from .catalog import Catalog, stream
from .errors import ClosedError, KeyNotFoundError, ReadOnlyError
from .lake import Lake
from .lake.location import require_existing
from .resources import render_sql
from .schema import key_list, metadata_columns, projection


class LakeView:
    """Read-only buffer-like access to a lake (``open_lake``); a ``RolloutReader``."""

    def __init__(self, url: str, storage_options: dict | None = None, run_id: str | None = None) -> None:
        self.lake = Lake(url, storage_options, read_only=True)
        require_existing(self.lake)  # a typo in the URL is an error, not an empty lake
        self.url = self.lake.url
        self.run_id = run_id
        self._closed = False
        self.schema = self.lake.schema(run_id)
        self.meta_columns = [c for c in metadata_columns(self.schema) if c != "policy_bucket"]
        self._catalog = Catalog(self.schema, self.meta_columns, native_meta=False)
        self.refresh()

    def refresh(self) -> None:
        """See snapshots committed since the view was opened."""
        self._dataset = self.lake.dataset(self.run_id)
        cols = ", ".join(f'"{c}"' for c in self.meta_columns)
        self._catalog.define_views({"__lakeview_rollouts": self._dataset}, [
            render_sql("lake_view", view="rollouts", source="__lakeview_rollouts"),
            render_sql("lake_meta_view", columns=cols),
        ])

    def dataset(self) -> pa.dataset.Dataset:
        """The pyarrow dataset this view is pinned to (its manifests as of ``open``/``refresh``)."""
        return self._dataset

    def _check(self) -> None:
        if self._closed:
            raise ClosedError("this lake view is closed")

    @property
    def runs(self) -> list[str]:
        return self.lake.runs()

    def sql(self, query: str, params: list | dict | None = None) -> pa.Table:
        """One read-only DuckDB statement over ``rollouts`` (= ``lake`` = ``cold``: every run) and ``meta``."""
        self._check()
        return self._catalog.user_query(query, params)

    def sample(
        self,
        n: int,
        where: str | None = None,
        sampler: Any = "uniform",
        columns: Sequence[str] | None = None,
        seed: int | None = 0,
        return_keys: bool = False,
        **options: Any,
    ) -> pa.Table | pa.Array:
        """Same contract as ``ReplayBuffer.sample``, over the lake's rows."""
        self._check()
        keys = _samplers.draw(_samplers.resolve(sampler, **options), self._catalog, n, where, seed)
        return keys if return_keys else self.get(keys, columns)

    def get(self, keys: Sequence[str] | pa.Array, columns: Sequence[str] | None = None) -> pa.Table:
        """Rows for ``keys`` in the given order (a scan of the key column with file pruning by key)."""
        self._check()
        keys = key_list(keys)
        cols, fetch = projection(self.schema, columns)
        wanted = pa.table({"key": pa.array(keys, pa.string())})
        sql = render_sql("lake_get", columns=", ".join(f'r."{c}"' for c in fetch))
        found = self._catalog.query(sql, sync=False, wanted=wanted)
        uniq = len(set(keys))
        if found.num_rows < uniq:
            missing = set(keys) - set(found.column("key").to_pylist())
            raise KeyNotFoundError(f"key {sorted(missing)[0]!r} is not in the lake")
        pos = pc.index_in(wanted.column("key"), value_set=found.column("key"))
        return found.take(pos).select(cols)

    def scan(self, where: str | None = None, columns: Sequence[str] | None = None, batch_size: int = 4096) -> Iterator[pa.RecordBatch]:
        """Stream matching rows as record batches (a private DuckDB connection; bounded memory)."""
        self._check()
        pred = predicate.check(where)
        cols = list(columns) if columns is not None else list(self.schema.names)
        sql = render_sql("lake_scan", columns=", ".join(f'"{c}"' for c in cols), where=pred)
        view = render_sql("lake_view", view="rollouts", source="__lakeview_rollouts")
        yield from stream(sql, {"__lakeview_rollouts": self._dataset}, batch_size, setup=[view])

    def count(self, where: str | None = None) -> int:
        """How many rollouts of the view match ``where`` (all if None)."""
        self._check()
        return self._catalog.count(where)

    def stats(self) -> dict[str, Any]:
        self._check()
        st = self.lake.stats(self.run_id)
        return {"run_id": self.run_id, "url": self.url, "runs": self.lake.runs(), "cold": st}

    def compact(self, *_: Any, **__: Any) -> dict:
        """Refused: a view writes nothing, maintenance included (compaction rewrites the lake's files)."""
        raise ReadOnlyError("a lake view is read-only; compact the lake with `lakebuffer compact <url>`, "
                            "lakebuffer.lake.Lake(url).compact(), or the run's ReplayBuffer.compact()")

    def __len__(self) -> int:
        return self.count()

    def push(self, *_: Any, **__: Any) -> None:
        raise ReadOnlyError("a lake view is read-only; push into a ReplayBuffer")

    def delete(self, *_: Any, **__: Any) -> None:
        raise ReadOnlyError("a lake view is read-only; delete through the run's ReplayBuffer")

    def snapshot(self, *_: Any, **__: Any) -> None:
        raise ReadOnlyError("a lake view is read-only; snapshots come from a ReplayBuffer")

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._catalog.close()

    def __enter__(self) -> LakeView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._closed:
            return f"LakeView({self.url!r}, closed)"
        runs = self.lake.runs()
        st = self.lake.stats(self.run_id)
        only = f", run_id={self.run_id!r}" if self.run_id else ""
        return f"LakeView({self.url!r}{only}, runs={runs!r}, rows={st['rows']}, files={st['files']})"

    def _repr_html_(self) -> str:
        if self._closed:
            return f"<pre>{html.escape(repr(self))}</pre>"
        return display.stats_html(f"LakeView {self.url}", self.stats())
