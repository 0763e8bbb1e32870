"""Machinery shared by the SQL samplers: predicates, seeded row hashes and the hash-threshold top-k.

Every sampler orders candidates by a seeded 64-bit hash of something content-derived (the key, a
group id, ...), so a sample depends only on the seed and on which rows match, never on where rows
live (hot, warm, cold) or in which order they were inserted: the same seed gives the same keys
after a restart.

The hot path, "the k matching rows with the smallest seeded key hash", is answered without a
top-N over every matching row: the query keeps only rows whose hash is under a threshold chosen so
that about ``1.5 k`` rows pass (from the population this predicate shape had last time, estimated
from the k-th smallest hash), and sorts just those. If fewer than k pass, the threshold grows and
the query runs again; the result is exactly the top-k either way, the threshold only decides how
much work is done.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from .. import predicate

if TYPE_CHECKING:
    from ..catalog import Catalog

U64 = 1 << 64
MAX_U64 = U64 - 1
#: meta column holding ``hash(key)``, if the catalog keeps one (hashing an integer is ~2x cheaper
#: than hashing the key string); the seeded hash is the same value with or without it.
KEY_HASH_COLUMN = "_key_hash"

_META_COLUMNS: weakref.WeakKeyDictionary[Any, frozenset[str]] = weakref.WeakKeyDictionary()
_SOURCES: weakref.WeakKeyDictionary[Any, dict[str, str]] = weakref.WeakKeyDictionary()
_TOTALS: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
#: population estimates of recent predicates (by shape), with the catalog's row count when taken (scaled by its
#: growth since: after a large ingest the old estimate would size the threshold for the old table); thresholds only
_POPULATION: OrderedDict[tuple, tuple[float, int]] = OrderedDict()
_CACHE_MAX = 512
# A predicate shape seen for the first time is sampled as if it kept 1/8 of the rows: a threshold that
# finds k rows in one pass down to ~6% selectivity. Guessing "all rows" found too few for a predicate
# keeping 30%: a count and a second pass, 17 of a resumed node's first `sample + get`'s 140 ms (2 GB).
# Sorting 8x more candidates under the threshold costs next to nothing (the scan dominates).
FIRST_GUESS_SHARE = 8.0
_CACHE_LOCK = threading.Lock()  # the caches are shared by every buffer of the process


# predicates ---------------------------------------------------------------------------------------
def combine(*preds: str | None) -> str:
    """``(a) AND (b) ...`` of the non-empty predicates, ``TRUE`` if none.

    Not checked here: the parts are a ``where`` that ``samplers.draw`` checked and SQL the samplers
    wrote (which may hold their own subqueries, e.g. ``key IN (SELECT key FROM meta ...)``).
    """
    parts = [f"({p})" for p in preds if p is not None and str(p).strip()]
    return " AND ".join(parts) if parts else "TRUE"


def check_expression(expr: str, what: str) -> str:
    """A user SQL expression (priority, ordering column), checked like a where (see ``predicate``)."""
    return predicate.check_expression(expr, what)


def resolve(catalog: Catalog, where: str | None, *parts: str | None) -> tuple[str, str]:
    """(source, predicate): ``meta`` unless the predicate needs payload columns, then ``rollouts``.

    Which columns a predicate binds to does not depend on its numeric literals, so the answer is
    remembered per catalog and predicate shape (a DuckDB round trip saved per call).
    """
    pred = combine(where, *parts)
    if pred == "TRUE":
        return "meta", pred
    shape = shape_of(pred)
    with _CACHE_LOCK:
        known = _SOURCES.get(catalog)
        if known is not None and shape in known:
            return known[shape], pred
    source = catalog.source_for(pred)
    with _CACHE_LOCK:
        known = _SOURCES.get(catalog)
        if known is None:
            known = {}
            try:
                _SOURCES[catalog] = known
            except TypeError:
                return source, pred
        if len(known) >= _CACHE_MAX:
            known.clear()
        known[shape] = source
    return source, pred


def literal(x: float | int) -> str:
    """A numeric SQL literal that round-trips exactly (floats as their shortest repr)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise TypeError(f"expected a number, got {x!r}")
    if isinstance(x, float) and not math.isfinite(x):
        raise ValueError(f"expected a finite number, got {x!r}")
    return repr(int(x)) if isinstance(x, int) else repr(float(x))


# seeded hashes ------------------------------------------------------------------------------------
def meta_columns(catalog: Catalog) -> frozenset[str]:
    try:
        return _META_COLUMNS[catalog]
    except (KeyError, TypeError):
        pass
    cols = frozenset(catalog.query(catalog.render("sample_meta_columns"), sync=False).column_names)
    try:
        _META_COLUMNS[catalog] = cols
    except TypeError:
        pass
    return cols


def key_hash(catalog: Catalog, source: str, seed: int) -> str:
    """SQL for the seeded 64-bit hash of each row's key: ``hash(xor(hash(key), seed))``.

    Not ``hash(key, seed)``: DuckDB combines the hashes of several arguments by XOR with the last
    one, so ordering by ``hash(key, seed)`` is one fixed order XOR a constant, and the same rows
    keep being drawn together whatever the seed. Mixing after the XOR makes every seed's order
    an independent-looking permutation.
    """
    base = KEY_HASH_COLUMN if source == "meta" and KEY_HASH_COLUMN in meta_columns(catalog) else "hash(key)"
    return f"hash(xor({base}, {int(seed)}::UBIGINT))"


def value_hash(exprs: Sequence[str], seed: int) -> str:
    """SQL for the seeded hash of one or more values (group ids, episode/team ids), mixed as above."""
    return f"hash(xor(hash({', '.join(exprs)}), {int(seed)}::UBIGINT))"


def uniform01(h: str) -> str:
    """SQL mapping a UBIGINT hash to a double strictly inside (0, 1) (53 bits, never 0 or 1)."""
    return f"((({h}) >> 11)::DOUBLE + 0.5) / 9007199254740992.0"


# the hash-threshold top-k --------------------------------------------------------------------------
def meta_rows(catalog: Catalog) -> int:
    t = catalog.query(catalog.render("sample_meta_rows"), sync=False)
    return int(t.column(0)[0].as_py() or 0)


def shape_of(pred: str) -> str:
    """The predicate with numeric literals blanked: ``policy_version >= 41`` and ``>= 42`` share a density."""
    return predicate.shape(pred)


def _rows_hint(catalog: Catalog) -> int:
    """The catalog's row count as it keeps it (0: it does not, e.g. a lake view's)."""
    return int(getattr(catalog, "meta_rows_hint", 0) or 0)


def _remember(key: tuple, population: float, rows: int) -> None:
    with _CACHE_LOCK:
        _POPULATION[key] = (population, rows)
        _POPULATION.move_to_end(key)
        while len(_POPULATION) > _CACHE_MAX:
            _POPULATION.popitem(last=False)


def _total_rows(catalog: Catalog) -> int:
    """Rows in meta, counted once per catalog (only the first guess of a new predicate uses it)."""
    total = _TOTALS.get(catalog)
    if total is None:
        total = meta_rows(catalog)
        try:
            _TOTALS[catalog] = total
        except TypeError:
            pass
    return max(total, 1)


def _fraction(k: int, population: float) -> float:
    """Share of the hash range that holds k rows with overwhelming probability (about 1.5 k + 8 sd)."""
    if population <= 0:
        return 1.0
    want = 1.5 * k + 8.0 * math.sqrt(k) + 32.0
    return min(1.0, want / population)


def smallest_by_hash(
    catalog: Catalog,
    k: int,
    *,
    template: str,
    fields: dict[str, Any],
    cache_key: tuple,
    count: Callable[[], int] | None = None,
    tables: dict[str, Any] | None = None,
) -> tuple[pa.Table, bool]:
    """The ``k`` rows of ``template`` with the smallest ``h``, in order.

    ``template`` must return a column ``h``, keep only rows with ``h <= {t}`` and return the
    ``{n}`` first by ``h`` (ties broken by a unique column, so the answer is exact). Returns
    ``(rows in order, exhausted)`` where ``exhausted`` means fewer than ``k`` rows exist (all
    were returned). The threshold is sized from the
    population this predicate shape had last time (else from the table size); ``count``
    (optional) gives the exact population, used once when that estimate was too high.
    """
    tables = tables or {}
    rows_now = _rows_hint(catalog)
    with _CACHE_LOCK:
        known = _POPULATION.get(cache_key)
    if known is None:  # a new predicate shape: guess it keeps 1 / FIRST_GUESS_SHARE of the rows, not all of them
        population = float(rows_now or _total_rows(catalog)) / FIRST_GUESS_SHARE
    else:
        population, rows_then = known
        if rows_then and rows_now:  # same selectivity, table grown (or shrunk) since
            population *= rows_now / rows_then
    frac = 1.0 if k <= 0 else _fraction(k, population)
    counted = False
    while True:
        t = MAX_U64 if frac >= 1.0 else max(1, int(frac * U64))
        sql = catalog.render(template, t=t, n=max(k, 1), **fields)
        rows = catalog.query(sql, sync=False, **tables)
        found = rows.num_rows
        if found >= k or frac >= 1.0:
            break
        if count is not None and not counted:
            counted = True
            population = float(count())
            if population < k:  # no threshold can find k: answer from a full pass
                frac = 1.0
                continue
            new = _fraction(k, population)
        else:
            new = _fraction(k, found / frac) if found else frac * 64.0
        frac = min(1.0, max(new, frac * 2.0))
    if k > 0 and found:
        if found >= k:  # the k-th smallest hash estimates the population: k / (h_k / 2^64)
            h_k = int(rows.column("h")[k - 1].as_py())
            estimate = k * (U64 / max(h_k, 1))
        else:
            estimate = float(found)
        _remember(cache_key, max(estimate, 1.0), rows_now)
    return rows, frac >= 1.0 and found < k


def next_k(k: int, wanted: int, got: int, candidates: int, valid: int) -> int:
    """How many candidates to ask for next when ``valid`` of ``candidates`` passed and ``got`` of
    ``wanted`` units are in hand: at least double, else enough at the observed pass rate."""
    rate = max(valid, 1) / max(candidates, 1)
    return max(2 * k, math.ceil(k + 1.3 * (wanted - got) / rate))


def uniform_keys(
    catalog: Catalog,
    n: int,
    source: str,
    pred: str,
    seed: int,
    *,
    tables: dict[str, Any] | None = None,
) -> pa.Array:
    """Up to ``n`` keys of rows matching ``pred``, uniformly without replacement, in random order."""
    h = key_hash(catalog, source, seed)
    rows, _ = smallest_by_hash(
        catalog,
        n,
        template="sample_threshold",
        fields={"source": source, "where": pred, "h": h},
        cache_key=("uniform", id(catalog), source, shape_of(pred)),
        count=lambda: count_rows(catalog, source, pred, tables),
        tables=tables,
    )
    return rows.column("key").combine_chunks()


def count_rows(catalog: Catalog, source: str, pred: str, tables: dict[str, Any] | None = None) -> int:
    t = catalog.query(catalog.render("sample_count", source=source, where=pred), sync=False, **(tables or {}))
    return int(t.column(0)[0].as_py() or 0)


def max_policy_version(catalog: Catalog) -> int | None:
    v = catalog.query(catalog.render("sample_max_version"), sync=False).column(0)[0].as_py()
    return None if v is None else int(v)


def empty_keys() -> pa.Array:
    return pa.array([], pa.string())


def take_in_order(keys: pa.Array, order: Iterable[int]) -> pa.Array:
    return keys.take(pa.array(list(order), pa.int64()))


_PASS_RATE: dict[tuple, float] = {}


def candidates_to_draw(cache_key: tuple, n: int, default_rate: float) -> int:
    """How many candidates to draw for ``n`` valid ones, from the pass rate seen last time."""
    return max(n, int(n / _PASS_RATE.get(cache_key, default_rate)))


def remember_pass_rate(cache_key: tuple, valid: int, candidates: int) -> None:
    """Record what share of drawn candidates (segments, teams) turned out valid."""
    if candidates:
        if len(_PASS_RATE) > 512:
            _PASS_RATE.clear()
        _PASS_RATE[cache_key] = max(valid, 1) / candidates


def rows_of_chosen(rows: pa.Table, by: str, chosen: pa.Array, order: list[tuple[str, str]]) -> pa.Array:
    """Keys of the rows whose ``by`` value was chosen, chosen ones in draw order, then ``order``."""
    slot = pc.index_in(rows.column(by), value_set=chosen)
    picked = rows.append_column("_slot", slot).filter(pc.is_valid(slot))
    picked = picked.sort_by([("_slot", "ascending"), *order])
    return picked.column("key").combine_chunks()
