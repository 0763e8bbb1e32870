"""lakebuffer.predicate: one parse of a where, and everything derived from it.

The expected pyarrow / Ray expressions are what the hand-written parser that predicate.py replaced
built for the same text (checked side by side when it was replaced).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import lakebuffer as lb
from lakebuffer.predicate import Bound, Untranslatable, check, check_expression, parse, partition_hint, shape

f = pc.field

PYARROW_CASES = [
    ("reward > 0.5 AND v >= -2", (f("reward") > 0.5) & (f("v") >= -2)),
    ("\"v\" IN (1, 2) OR s = 'it''s'", ((f("v") == 1) | (f("v") == 2)) | (f("s") == "it's")),
    ("NOT ok OR s IS NULL", ~f("ok") | f("s").is_null()),
    ("x IS NOT NULL", f("x").is_valid()),
    ("NOT (y IS NULL)", ~f("y").is_null()),
    ("v BETWEEN 1 AND 3", (f("v") >= 1) & (f("v") <= 3)),
    ("v NOT BETWEEN -1 AND 2e3", ~((f("v") >= -1) & (f("v") <= 2000.0))),
    ("v NOT IN (1, 2)", ~((f("v") == 1) | (f("v") == 2))),
    ("NOT (v = 1)", ~(f("v") == 1)),
    ("x == 1 AND y <> 2 AND z != 3", ((f("x") == 1) & (f("y") != 2)) & (f("z") != 3)),
    ("1 < x", pc.scalar(1) < f("x")),
    ("(a > 1) = TRUE", (f("a") > 1) == pc.scalar(True)),
    ("a > 1.5 OR (b < 2 AND c >= .5)", (f("a") > 1.5) | ((f("b") < 2) & (f("c") >= 0.5))),
    ("verified", f("verified")),
    ("a = b", f("a") == f("b")),
    ("v IN (1, 2, 3)", ((f("v") == 1) | (f("v") == 2)) | (f("v") == 3)),
]


@pytest.mark.parametrize(("where", "expected"), PYARROW_CASES)
def test_pyarrow_expression_is_what_the_old_parser_built(where, expected):
    assert parse(where).to_pyarrow().equals(expected)


def test_long_in_lists_keep_sql_null_semantics():
    values = list(range(40))
    expected = pc.if_else(f("v").is_valid(), f("v").isin(values), pa.scalar(None, pa.bool_()))
    assert parse(f"v IN ({', '.join(map(str, values))})").to_pyarrow().equals(expected)


@pytest.mark.parametrize(
    "where",
    ["len(s) > 2", "v + 1 > 2", "c.v > 1", "x::INT > 1", "prompt_id LIKE 'p1%'", "x IS TRUE", "x = -y", "-x > 1",
     "lambda x: x > 1", "list_contains(tags, 'a')"],
)
def test_untranslatable(where):
    with pytest.raises(Untranslatable):
        parse(where).to_pyarrow()


def test_binding_against_a_schema():
    schema = pa.schema([("s", pa.string()), ("t", pa.timestamp("us", tz="UTC")), ("v", pa.int64())])
    assert parse("v > 1").to_pyarrow(schema).equals(f("v") > 1)
    for where in ["s = 3", "t > '2026-01-01'", "missing > 1"]:
        with pytest.raises(Untranslatable):
            parse(where).to_pyarrow(schema)


def test_ray_expression_is_what_the_old_parser_built():
    x = pytest.importorskip("ray.data.expressions")
    got = parse("v IN (1, 2) AND NOT (s IS NULL) OR r >= 0.5").to_ray()
    want = (((x.col("v") == x.lit(1)) | (x.col("v") == x.lit(2))) & ~x.col("s").is_null()) | (x.col("r") >= x.lit(0.5))
    assert got.structurally_equals(want)
    assert parse("s IS NOT NULL").to_ray().structurally_equals(x.col("s").is_not_null())
    with pytest.raises(Untranslatable):
        parse("len(s) > 2").to_ray()


def test_columns():
    assert parse("reward > 0.5 AND policy_version >= 7").columns == {"reward", "policy_version"}
    assert parse("len(response_ids) = 4 AND \"Odd name\" IS NULL").columns == {"response_ids", "Odd name"}
    assert {"s", "a"} <= parse("s.a > 1").columns  # a struct field: the struct column is named too
    assert parse("prompt_id = 'reward'").columns == {"prompt_id"}  # not the string literal
    assert parse(None).columns == frozenset()


def test_sql_is_the_users_text_parenthesised():
    assert check("  reward > 0.5 ") == "(reward > 0.5)"
    assert check("x -> 'a' = 1") == "(x -> 'a' = 1)"  # DuckDB decides what it means, not a transpiler
    for every in [None, "", "   ", "TRUE", "true"]:
        assert check(every) == "TRUE" and parse(every).is_true


def test_shape_ignores_numeric_literals_only():
    assert parse("policy_version >= 41").shape == parse("policy_version >= 42").shape
    assert shape("reward > 0.5 AND v = 3") == shape("reward  >  1e3 AND v = 7")
    assert shape("prompt_id = 'a'") != shape("prompt_id = 'b'")
    assert shape("a > 1") != shape("b > 1")
    assert shape("key NOT IN (SELECT key FROM t)") == "key NOT IN ( SELECT key FROM t )"  # no check


#: (bucket size, where, hint): the partition hints a where implies (Lake.prune_hint uses the same cases)
PARTITION_HINT_CASES = [
        (1, "policy_version >= 7", "policy_bucket >= 7"),
        (1, "policy_version > 7", "policy_bucket >= 8"),
        (10, "policy_version > 9", "policy_bucket >= 1"),
        (10, "policy_version < 10", "policy_bucket <= 0"),
        (10, "policy_version <= 10", "policy_bucket <= 1"),
        (10, "policy_version = 25", "policy_bucket = 2"),
        (10, "policy_version == 25", "policy_bucket = 2"),
        (10, "15 <= policy_version", "policy_bucket >= 1"),
        (10, "policy_version BETWEEN 5 AND 31", "policy_bucket BETWEEN 0 AND 3"),
        (10, "policy_version IN (1, 12, 13)", "policy_bucket IN (0, 1)"),
        (10, 'c."policy_version" >= 20', "c.policy_bucket >= 2"),
        (10, "POLICY_VERSION >= -5", "policy_bucket >= -1"),
        (1, "(reward > 0.5 AND (policy_version >= 3)) AND verified", "policy_bucket >= 3"),
        (1, "(a OR b) AND policy_version >= 3", "policy_bucket >= 3"),
        (1, "policy_version >= 3 AND policy_version < 5", "policy_bucket >= 3 AND policy_bucket <= 4"),
]
#: wheres that imply no hint and are returned as they are
UNHINTED_WHERES = [
        "reward > 0.5 OR policy_version >= 7",
        "NOT policy_version >= 7",
        "policy_version >= 7.5",
        "policy_version <> 3",
        "policy_version NOT BETWEEN 1 AND 3",
        "policy_version NOT IN (1, 2)",
        "prompt_id = 'policy_version >= 3'",
        "policy_version >= 3 + 1",
        "a.b.policy_version >= 3",
        "",
        None,
        "other_version >= 3",
        "policy_version >= 3; DROP TABLE x",  # not a predicate: left for the real check to refuse
]


@pytest.mark.parametrize(("size", "where", "hint"), PARTITION_HINT_CASES)
def test_partition_hint_matches_the_lakes_prune_hint(size, where, hint):
    assert partition_hint(where, "policy_version", "policy_bucket", size) == f"{where} AND {hint}"


@pytest.mark.parametrize("where", UNHINTED_WHERES)
def test_partition_hint_leaves_other_predicates_alone(where):
    assert partition_hint(where, bucket_size=1) == where


def test_bounds():
    p = parse("policy_version BETWEEN 2 AND 9 AND reward > 0 AND 4 < policy_version AND policy_version IN (3, 5)")
    assert p.bounds("policy_version") == (Bound("between", (2, 9)), Bound(">", (4,)), Bound("in", (3, 5)))
    assert parse("reward > 0 OR policy_version > 1").bounds("policy_version") == ()
    assert [c.sql() for c in parse("(a AND (b)) AND (c OR d)").conjuncts()] == ["a", "b"]


@pytest.mark.parametrize(
    "where",
    [
        "reward > 0; DROP TABLE meta",
        "TRUE; DROP TABLE x",
        "reward > 0;",
        "COPY meta TO '/tmp/x.parquet'",
        "ATTACH '/tmp/x.db' AS x",
        "DETACH x",
        "SELECT 1",
        "(SELECT count(*) FROM meta) > 0",
        "key IN (SELECT key FROM meta)",
        "EXISTS (SELECT 1)",
        "read_parquet('/etc/passwd') IS NULL",
        "len(read_text('/etc/passwd')) > 0",
        "(SELECT 1 FROM read_csv('x.csv')) = 1",
        "getenv('HOME') = 'x'",
        "parquet_scan('x') IS NULL",
        "glob('*') IS NULL",
        "reward > 0 UNION SELECT 1",
        "reward >",
        "reward > 0 reward < 1",
        "(reward > 0",
        "INSTALL httpfs",
        "SET threads TO 1",
        "PRAGMA version",
    ],
)
def test_rejected_forms_raise_query_error(where):
    with pytest.raises(lb.QueryError):
        parse(where)
    with pytest.raises(lb.QueryError):
        check(where)


def test_semicolon_inside_a_string_is_data():
    assert check("s = 'a;b'") == "(s = 'a;b')"


def test_opaque_predicates_duckdb_parses_are_kept():
    opaque = parse("lambda x: x > 1")  # DuckDB's lambda syntax: sqlglot does not parse it
    assert opaque.opaque and "x" in opaque.columns
    with pytest.raises(Untranslatable):
        opaque.to_pyarrow()
    with pytest.raises(lb.QueryError):
        parse("lambda x: x > 1 AND (SELECT 1) = 1")


def test_composed_mode_allows_subqueries_over_named_tables_only():
    sql = "(reward > 0) AND (key IN (SELECT key FROM meta WHERE sample_count < 1))"
    assert check(sql, composed=True) == f"({sql})"
    for bad in ["key IN (SELECT key FROM read_parquet('x'))", "key IN (SELECT key FROM 'x.parquet')",
                "key IN (SELECT key FROM \"x.parquet\")", "key IN (SELECT key FROM other.meta)",
                "SELECT 1", "TRUE; DROP TABLE meta", "COPY meta TO 'x'"]:
        with pytest.raises(lb.QueryError):
            check(bad, composed=True)


def test_check_expression():
    assert check_expression("reward * 2", "priority") == "(reward * 2)"
    assert check_expression("TRUE", "priority") == "(TRUE)"
    with pytest.raises(ValueError):
        check_expression("  ", "priority")
    with pytest.raises(lb.QueryError, match="priority"):
        check_expression("reward; DROP TABLE meta", "priority")
    with pytest.raises(lb.QueryError, match="priority"):
        check_expression("(SELECT max(reward) FROM meta)", "priority")


def test_parses_are_cached():
    assert parse("reward > 0.123") is parse("  reward > 0.123")
