"""What a user's SQL may do: read the data it was given, nothing else.

Two layers, because either alone has holes:

* ``sandbox(con)``: every DuckDB connection lakebuffer opens runs with ``enable_external_access``
  off and the configuration locked. DuckDB then refuses ``read_csv('/etc/passwd')``, ``COPY ... TO``,
  ``ATTACH '<file>'``, ``INSTALL``/``LOAD`` and any ``SET``, for the statement and for every function
  in it, while the Arrow objects lakebuffer registers (hot tables, the warm Lance dataset, the lake's
  pyarrow dataset, which read through pyarrow's own filesystems) still scan.
* ``check_read_only(sql)``: ``sql()`` takes one read-only statement, classified by DuckDB's own
  parser (``duckdb.extract_statements``), so nothing the engine would run differently slips past:
  ``SELECT``/``WITH``/``FROM``/``VALUES``/``DESCRIBE``/``SHOW``/``SUMMARIZE``/``UNPIVOT`` (all
  SELECT statements to DuckDB), ``PIVOT``, and ``EXPLAIN`` of one of those. ``DROP TABLE meta``,
  ``CREATE OR REPLACE VIEW rollouts``, ``DELETE``, ``PRAGMA``, ``CALL``, ``CHECKPOINT`` ... raise
  ``ReadOnlyError``: lakebuffer's catalog objects change only through the API (``push``, ``delete``).
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any

import duckdb

from .errors import QueryError, ReadOnlyError, query_error

_LEAD = re.compile(r"^(?:\s+|--[^\n]*(?:\n|$)|/\*.*?\*/)*", re.S)
_EXPLAIN = re.compile(r"^EXPLAIN\s+(?:ANALY[SZ]E\s+)?(?:\([^)]*\)\s*)?", re.I)
_PIVOT = re.compile(r"^(?:UN)?PIVOT\b", re.I)
_ALLOWED = "SELECT, WITH, FROM, VALUES, DESCRIBE, SHOW, SUMMARIZE, PIVOT, UNPIVOT, or EXPLAIN of one of those"


#: Working memory of a connection that has no budget of its own (a lake view, an eviction score);
#: past it DuckDB spills to ``spill_dir`` (sorts, hash tables, even in-memory tables) instead of growing.
DEFAULT_QUERY_MEMORY = 512 << 20
#: DuckDB's least workable memory over rollouts: a 2,048-row vector of 4k-token lists is ~17 MB per
#: column and each thread holds a few; under 32 MB a payload sort of 1 GB failed ("could not allocate"),
#: at 256 MB it spilled and finished. The fixed part of the memory bound (300 MB) covers it.
QUERY_MEMORY_FLOOR = 256 << 20


def default_spill_dir() -> Path:
    """Where budget-less connections spill: a per-process folder in the system's temp directory
    (DuckDB's own default, ``.tmp`` in the current directory, would write into the user's cwd)."""
    return Path(tempfile.gettempdir()) / f"lakebuffer-spill-{os.getpid()}"


def sandbox(con: duckdb.DuckDBPyConnection, memory_limit_bytes: int | None = None,
            spill_dir: str | os.PathLike | None = None) -> duckdb.DuckDBPyConnection:
    """No file or network access from ``con`` and no configuration change, from now on; its memory
    bounded by ``memory_limit_bytes`` (default ``DEFAULT_QUERY_MEMORY``), spilling to ``spill_dir``.

    Set what else the connection needs (``threads``) before calling this: the lock covers every option.
    Spilling still works with external access off (measured: a sort of 5M 100-byte strings under 100 MB).
    """
    limit_kib = max(int(memory_limit_bytes or DEFAULT_QUERY_MEMORY) >> 10, 16 << 10)
    spill = str(spill_dir or default_spill_dir()).replace("'", "''")
    con.execute(f"SET memory_limit = '{limit_kib}KiB'")
    con.execute(f"SET temp_directory = '{spill}'")
    # DuckDB estimates a Python Arrow scan (the warm Lance dataset, a lake dataset) at ~1 row, so its
    # build-side optimizer hashes the payload side of ``rollouts``' join with ``meta``: measured on 1 GB
    # of warm rollouts, ``avg(len(response_ids))`` took 530 MB of anonymous RSS, 74 MB with the flip off
    # (the views put the small side, ``meta``, on the right, where a hash join builds).
    con.execute("SET disabled_optimizers = 'build_side_probe_side'")
    try:  # a library never draws on the user's terminal; in Jupyter without ipywidgets DuckDB has no
        con.execute("SET enable_progress_bar = false")  # bar to draw and refuses the setting itself
    except duckdb.Error:
        pass
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")
    return con


#: Longest ``sql()`` text. DuckDB's optimizer is superlinear in long OR chains: measured on the 2-core
#: machine over 100 rows, 2,700 ``OR`` terms (66 KB) 1.1 s, 5,000 (124 KB) 2.9 s, 20,000 (509 KB) 32.5 s;
#: a 100,000-value ``IN`` (589 KB) 5.4 s. Nesting is bounded by DuckDB itself (``max_expression_depth``
#: 1000, a ``QueryError`` in well under a second; the configuration is locked, so it stays 1000).
MAX_SQL_CHARS = 65_536


def check_read_only(sql: str) -> str:
    """``sql`` if it is one read-only statement; ``ReadOnlyError`` (or ``QueryError``) otherwise."""
    if not isinstance(sql, str) or not sql.strip():
        raise QueryError("sql() needs one SQL statement, e.g. SELECT count(*) FROM rollouts")
    if len(sql) > MAX_SQL_CHARS:
        raise QueryError(f"sql() text is {len(sql):,} characters long, over the limit of MAX_SQL_CHARS={MAX_SQL_CHARS:,} "
                         "(lakebuffer.sandbox): pass long value lists as a parameter (sql(query, params=[...]) with "
                         "`x IN (SELECT unnest(?))`) or split the query; it starts "
                         f"{sql[:60]!r}")
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as e:
        raise query_error(e) from e
    if len(statements) != 1:
        raise QueryError(f"sql() runs one statement, this text has {len(statements)}; call it once per statement")
    _check(statements[0], sql)
    return sql


def _check(statement: Any, sql: str) -> None:
    kind = statement.type
    text = _LEAD.sub("", statement.query)
    if kind == duckdb.StatementType.SELECT:
        return
    if kind == duckdb.StatementType.MULTI and _PIVOT.match(text):
        return
    if kind == duckdb.StatementType.EXPLAIN:  # EXPLAIN ANALYZE runs its statement: check that one
        inner = _EXPLAIN.sub("", text, count=1)
        inner_statements = duckdb.extract_statements(inner) if inner != text else []
        if len(inner_statements) == 1:
            _check(inner_statements[0], sql)
            return
    raise ReadOnlyError(
        f"sql() is read-only and takes {_ALLOWED}; {kind.name} is not allowed: {sql.strip()[:80]!r} "
        "(rows change through push/delete/update_priority; files are read through the lake)"
    )
