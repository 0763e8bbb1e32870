"""A bad ``where`` or ``sql()`` is a ``QueryError`` within bounded time, naming the limit (issue 24 item 4).

Before: 5,000 nested parentheses or 3,000 ``NOT``s raised ``RecursionError`` (outside the
``LakeBufferError`` root), a 20,000-term ``OR`` took 30 s and a 100,000-value ``IN`` 47 s.
The time bounds are generous (a loaded 2-core machine): each refusal is well under a second quiet.
"""

from __future__ import annotations

import time

import pytest

import lakebuffer as lb
from lakebuffer import predicate
from lakebuffer.sandbox import MAX_SQL_CHARS
from tests.rollouts import make_rollouts

BOUND_S = 5.0

_BAD = {
    "parens_5000": ("(" * 5000 + "reward > 0.5" + ")" * 5000, "MAX_WHERE_"),
    "not_3000": ("NOT " * 3000 + "reward > 0.5", "MAX_WHERE_DEPTH"),
    "parens_200": ("(" * 200 + "reward > 0.5" + ")" * 200, "MAX_WHERE_DEPTH"),
    "functions_100": ("abs(" * 100 + "reward" + ")" * 100 + " > 0", "MAX_WHERE_DEPTH"),
    "case_100": ("CASE WHEN reward > 0 THEN " * 100 + "TRUE" + " END" * 100, "MAX_WHERE_DEPTH"),
    "minus_3000": ("reward > " + "- " * 3000 + "1", "MAX_WHERE_DEPTH"),
    "or_20000": (" OR ".join(f"policy_version = {i}" for i in range(20000)), "MAX_WHERE_CHARS"),
    "in_100000": ("policy_version IN (" + ",".join(str(i) for i in range(100000)) + ")", "MAX_WHERE_CHARS"),
    "tokens_9000": ("policy_version IN (" + ",".join("1" for _ in range(4600)) + ")", "MAX_WHERE_TOKENS"),
}


@pytest.fixture(scope="module")
def buf(tmp_path_factory):
    with lb.ReplayBuffer.open(tmp_path_factory.mktemp("q") / "b", memory_limit_mb=128, snapshot_interval_s=0) as b:
        b.push(make_rollouts(50, tokens=4))
        yield b


def _refused(call, limit: str) -> None:
    t0 = time.monotonic()
    with pytest.raises(lb.QueryError) as e:
        call()
    took = time.monotonic() - t0
    assert limit in str(e.value), str(e.value)[:300]
    assert took < BOUND_S, f"refused after {took:.1f} s"


@pytest.mark.parametrize("name", list(_BAD))
@pytest.mark.parametrize("entry", ["parse", "sample", "count", "delete", "scan"])
def test_bad_where_is_query_error_in_bounded_time(buf, name, entry):
    where, limit = _BAD[name]
    calls = {
        "parse": lambda: predicate.parse(where),
        "sample": lambda: buf.sample(1, where=where),
        "count": lambda: buf.count(where),
        "delete": lambda: buf.delete(where=where),
        "scan": lambda: list(buf.scan(where=where)),
    }
    _refused(calls[entry], limit)
    assert len(buf) == 50  # nothing deleted


def test_bad_evict_expression_is_refused_in_bounded_time(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(lb.OptionError, match="MAX_WHERE_DEPTH") as e:
        lb.ReplayBuffer.open(tmp_path / "b", evict="NOT " * 3000 + "reward")
    assert time.monotonic() - t0 < BOUND_S and len(str(e.value)) < 1000
    _refused(lambda: predicate.check_expression("NOT " * 3000 + "reward", "evict"), "MAX_WHERE_DEPTH")


@pytest.mark.parametrize("name", ["parens_5000", "not_3000", "or_20000", "in_100000"])
def test_bad_sql_is_query_error_in_bounded_time(buf, name):
    where, _ = _BAD[name]
    query = f"SELECT count(*) FROM rollouts WHERE {where}"
    limit = "MAX_SQL_CHARS" if len(query) > MAX_SQL_CHARS else "max_expression_depth"
    _refused(lambda: buf.sql(query), limit)


def test_sql_limit_message_shows_the_way_for_long_value_lists(buf):
    values = list(range(100000))
    t0 = time.monotonic()
    out = buf.sql("SELECT count(*) AS n FROM meta WHERE policy_version IN (SELECT unnest(?))", [values])
    assert out.column("n")[0].as_py() == 50
    assert time.monotonic() - t0 < BOUND_S


def test_long_and_chain_within_limits_translates_without_recursion(buf):
    """1,500 ANDs were a RecursionError in the pushdown translation; now a balanced expression."""
    where = " AND ".join(f"reward > -{i}" for i in range(1500))
    assert len(where) < predicate.MAX_WHERE_CHARS
    expr = predicate.parse(where).to_pyarrow()
    assert "reward" in str(expr)[:200]
    assert len(predicate.parse(where).bounds("reward")) == 1500
    assert buf.count(where) == 50
    assert buf.sample(5, where=where).num_rows == 5


def test_predicates_at_the_limits_still_work(buf):
    nested = "(" * 30 + "reward >= 0" + ")" * 30
    assert buf.count(nested) == 50
    in_list = "policy_version IN (" + ",".join(str(i) for i in range(3000)) + ")"
    assert len(in_list) < predicate.MAX_WHERE_CHARS
    t0 = time.monotonic()
    assert buf.sample(3, where=in_list).num_rows == 3
    assert time.monotonic() - t0 < BOUND_S
