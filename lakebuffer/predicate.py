"""One predicate model: a user's ``where`` parsed once (sqlglot, dialect duckdb), everything derived.

A ``where`` is DuckDB SQL text. :func:`parse` turns it into a frozen :class:`Where` (cached per
text) and every consumer reads the same parse instead of scanning the text its own way:

* the validity check (:func:`check`): exactly one expression, no ``;``, no statement (``COPY``,
  ``ATTACH``, ``SELECT``...), no subquery, no table or file-reading function -> ``QueryError``.
  A predicate can only look at the rows it is given (guarantee 5 of DESIGN.md). ``check(sql,
  composed=True)`` is the catalog's variant for SQL the samplers build around a checked ``where``:
  there, subqueries over the catalog's own named tables are allowed (``key IN (SELECT key FROM
  meta ...)``), statements, file/table functions and file paths still are not;
* ``Where.sql``: the text to paste into DuckDB, parenthesised. It is the user's own text, not
  sqlglot's regeneration: DuckDB, not a transpiler, decides what it means;
* ``Where.columns``: the names it references (a superset: qualifiers and struct parts included);
* ``Where.to_pyarrow()`` / ``Where.to_ray()``: pushdown expressions for the simple subset
  (comparisons, AND/OR/NOT, IN, BETWEEN, IS [NOT] NULL over columns and literals); anything else
  raises :class:`Untranslatable` and the caller lets DuckDB evaluate the text;
* ``Where.shape``: the text with numeric literals replaced by ``#`` (the samplers' cache key:
  ``policy_version >= 41`` and ``>= 42`` have similar densities and bind the same columns);
* ``Where.bounds(column)`` and :func:`partition_hint`: integer constraints on a column in the
  top-level ANDs, and the partition-bucket predicates they imply (hidden partitioning for engines
  that prune only on hive columns).

If sqlglot cannot parse text that DuckDB's own parser accepts (sqlglot's dialect lags DuckDB's
grammar now and then), the predicate is kept as *opaque*: still checked token by token for the
forbidden constructs, never pushed down, columns = every identifier.

Cost, measured on the shared 2-core machine: sqlglot tokenize + parse of ``reward > 0.5 AND
policy_version >= 7 AND len(response_ids) < 100`` takes 0.27-0.73 ms (the token-only ``shape``
0.12 ms), against ~10 ms for a whole ``buffer.sample(64, where=...)`` on 2,000 rows in the same run:
3-7% per call, paid on every call by the samplers. So parses and shapes are cached per text
(``functools.lru_cache``, 1024 entries): a repeated ``where`` costs 0.4 us.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import Token, TokenType

from .errors import QueryError
from .pushdown import CMP_OPS, PyArrowBuild, RayBuild, Translate, Untranslatable, operands

__all__ = [
    "Bound",
    "Untranslatable",
    "Where",
    "check",
    "check_expression",
    "parse",
    "partition_hint",
    "shape",
]

_DIALECT = sqlglot.Dialect.get_or_raise("duckdb")

#: statement-like nodes: a predicate is an expression, never a statement or a query
_FORBIDDEN_NODES: tuple[type, ...] = tuple(
    getattr(exp, n) for n in ("Query", "Subquery", "Exists", "DDL", "DML", "Command", "Copy", "Attach", "Detach",
                              "Pragma", "Set", "Use", "Transaction", "Commit", "Rollback", "Install", "Describe",
                              "Show", "Summarize", "Table", "Values", "Into", "From", "Join")
    if hasattr(exp, n)
)
#: allowed in SQL the library composed (``key IN (SELECT key FROM meta ...)``): queries over named tables
_QUERY_NODES: tuple[type, ...] = tuple(getattr(exp, n) for n in ("Query", "Subquery", "Exists", "Table", "From", "Join"))
_TABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_STATEMENT_NODES = tuple(n for n in _FORBIDDEN_NODES if n not in _QUERY_NODES)
#: functions that read files, other tables or the environment (DuckDB table functions and friends)
_FORBIDDEN_FUNCS = frozenset({
    "glob", "getenv", "query", "query_table", "sniff_csv", "parquet_metadata", "parquet_schema",
    "parquet_file_metadata", "parquet_kv_metadata", "parquet_bloom_probe", "load", "install", "attach",
    "duckdb_secrets", "duckdb_settings", "duckdb_extensions", "sqlite_attach", "postgres_attach",
})
#: keywords whose token alone disqualifies an opaque predicate
_FORBIDDEN_TOKENS = frozenset(getattr(TokenType, n) for n in (
    "SELECT", "FROM", "WITH", "UNION", "INTERSECT", "EXCEPT", "INSERT", "UPDATE", "DELETE", "CREATE", "DROP",
    "ALTER", "COPY", "ATTACH", "DETACH", "PRAGMA", "SET", "USE", "INSTALL", "LOAD", "COMMAND", "EXISTS", "TABLE",
    "VALUES", "INTO", "EXECUTE", "DESCRIBE", "SHOW", "SUMMARIZE", "PIVOT", "UNPIVOT",
) if hasattr(TokenType, n))
_QUERY_TOKENS = frozenset(getattr(TokenType, n) for n in ("SELECT", "FROM", "UNION", "INTERSECT", "EXCEPT", "EXISTS")
                          if hasattr(TokenType, n))


#: Limits on a user's ``where`` (and any SQL expression checked here), so that a bad one is a
#: ``QueryError`` in bounded time, never a ``RecursionError`` or a parse of minutes. Measured on the
#: shared 2-core machine: sqlglot spends ~18 Python frames per nested parenthesis (60 levels overflow
#: the default recursion limit, 3,000 ``NOT``s too) and ~0.1 ms per token (a 20,000-term ``OR`` 30 s
#: end to end, a 100,000-value ``IN`` 47 s; tokenizing its 589 KB alone 4.6 s).
MAX_WHERE_CHARS = 32_768
#: tokens (a value, a name, an operator, a parenthesis each): a 2,000-term OR is ~8,000 (0.8 s to parse)
MAX_WHERE_TOKENS = 8_192
#: nesting: parentheses (and function calls, brackets), CASE ... END and chains of prefix operators
#: (``NOT NOT x``, ``- - x``) each add one level
MAX_WHERE_DEPTH = 32
_OPEN = frozenset(getattr(TokenType, n) for n in ("L_PAREN", "L_BRACKET", "L_BRACE", "CASE") if hasattr(TokenType, n))
_CLOSE = frozenset(getattr(TokenType, n) for n in ("R_PAREN", "R_BRACKET", "R_BRACE", "END") if hasattr(TokenType, n))
_PREFIX = frozenset(getattr(TokenType, n) for n in ("NOT", "DASH", "PLUS", "TILDA") if hasattr(TokenType, n))
_LIMIT_HELP = ("split it into smaller predicates, or for many keys use get(keys)/delete(keys=...) or a "
               "column that groups them")


def _too_long(text: str, what: str) -> QueryError:
    return QueryError(f"{what} is {len(text):,} characters long, over the limit of MAX_WHERE_CHARS="
                      f"{MAX_WHERE_CHARS:,} (lakebuffer.predicate): {_LIMIT_HELP}; it starts {text[:60]!r}")


def _check_size(tokens: list[Token], text: str, what: str, composed: bool = False) -> None:
    """``QueryError`` naming the limit when ``tokens`` are too many or nest too deep (no recursion).

    ``composed``: SQL the library built around a checked where, which gets room for its own parts."""
    slack = MAX_WHERE_DEPTH if composed else 0
    if len(tokens) > MAX_WHERE_TOKENS + 32 * slack:
        raise QueryError(f"{what} has {len(tokens):,} tokens, over the limit of MAX_WHERE_TOKENS={MAX_WHERE_TOKENS:,} "
                         f"(lakebuffer.predicate): {_LIMIT_HELP}; it starts {text[:60]!r}")
    depth = deepest = run = 0
    for t in tokens:
        kind = t.token_type
        if kind in _PREFIX:
            run += 1
        else:
            run = 0
        if kind in _OPEN:
            depth += 1
        elif kind in _CLOSE:
            depth = max(depth - 1, 0)
        deepest = max(deepest, depth + run)
    if deepest > MAX_WHERE_DEPTH + slack:
        raise QueryError(f"{what} nests {deepest} levels deep (parentheses, CASE, chained NOT or signs), over the "
                         f"limit of MAX_WHERE_DEPTH={MAX_WHERE_DEPTH} (lakebuffer.predicate): write it flatter, e.g. "
                         f"a IN (...) or a AND b instead of nested groups; it starts {text[:60]!r}")


def _too_deep(text: str, what: str) -> QueryError:
    """The parser ran out of stack anyway (a caller deep in its own stack): still a ``QueryError``."""
    return QueryError(f"{what} nests too deeply for the SQL parser (Python's recursion limit; the checked limit "
                      f"is MAX_WHERE_DEPTH={MAX_WHERE_DEPTH} in lakebuffer.predicate): write it flatter; "
                      f"it starts {text[:60]!r}")


def _forbidden_func(name: str) -> bool:
    n = name.lower()
    return n in _FORBIDDEN_FUNCS or n.startswith(("read_", "iceberg_", "delta_")) or n.endswith("_scan")


def _func_name(node: exp.Expression) -> str | None:
    if isinstance(node, exp.Anonymous):
        return str(node.name)
    if isinstance(node, exp.Func):
        return node.sql_name()
    return None


def _tokens(text: str) -> list[Token]:
    try:
        return _DIALECT.tokenize(text)
    except TokenError as e:
        raise QueryError(f"cannot read the SQL expression {text!r}: {e}") from e


def _check_tree(tree: exp.Expression, text: str, what: str, composed: bool) -> None:
    if composed and isinstance(tree, exp.Query):
        raise QueryError(f"{what} must be a SQL expression, not a query: {text!r}")
    for node in tree.walk():
        if composed and isinstance(node, exp.Table) and not (  # a file path would be a DuckDB replacement scan
                isinstance(node.this, exp.Identifier) and _TABLE_NAME.fullmatch(node.name) and not node.args.get("db")):
            raise QueryError(f"{what} may read only the catalog's tables, not {node.sql('duckdb')}: {text!r}")
        if isinstance(node, _STATEMENT_NODES if composed else _FORBIDDEN_NODES):
            raise QueryError(f"{what} must be a single SQL expression over the row's columns; "
                             f"{type(node).__name__.upper()} is not allowed in {text!r}")
        name = _func_name(node)
        if name is not None and _forbidden_func(name):
            raise QueryError(f"{what} may not call {name.lower()}() (it reads data other than the row): {text!r}")


def _check_opaque(tokens: list[Token], text: str, what: str, composed: bool) -> None:
    for i, t in enumerate(tokens):
        if composed and t.token_type == TokenType.FROM and i + 1 < len(tokens) and \
                tokens[i + 1].token_type not in (TokenType.VAR, TokenType.IDENTIFIER):
            raise QueryError(f"{what} may read only the catalog's tables: {text!r}")
        if t.token_type in _FORBIDDEN_TOKENS and not (composed and t.token_type in _QUERY_TOKENS):
            raise QueryError(f"{what} must be a single SQL expression over the row's columns; "
                             f"{t.text.upper()} is not allowed in {text!r}")
        nxt = tokens[i + 1] if i + 1 < len(tokens) else None
        if nxt is not None and nxt.token_type == TokenType.L_PAREN and _forbidden_func(t.text):
            raise QueryError(f"{what} may not call {t.text.lower()}() (it reads data other than the row): {text!r}")


def _duckdb_accepts(text: str) -> str | None:
    """DuckDB's own parser on ``SELECT 1 WHERE <text>``: ``None`` if it parses as one statement, else why not."""
    import duckdb

    try:
        stmts = duckdb.extract_statements(f"SELECT 1 WHERE {text}")
    except duckdb.Error as e:
        return str(e)
    return None if len(stmts) == 1 else "more than one statement"


@dataclass(frozen=True)
class Bound:
    """An integer constraint on a column from one top-level conjunct.

    ``op`` is one of ``>= > = <= <`` (``values`` = one value), ``between`` (two) or ``in`` (several);
    ``qualifier`` is the table qualifier as written (``'c.'``, ``'"c".'`` or ``''``).
    """

    op: str
    values: tuple[int, ...]
    qualifier: str = ""


_FLIP = {">": "<", "<": ">", ">=": "<=", "<=": ">=", "=": "="}


@dataclass(frozen=True, eq=False)
class Where:
    """A parsed ``where`` (see the module docstring). Build it with :func:`parse`; never mutate ``tree``.

    ``text`` is the stripped user text (``None``: every row); ``tree`` the sqlglot AST (``None``
    for every row or for an opaque predicate); ``tokens`` the sqlglot tokens.
    """

    text: str | None
    tree: exp.Expression | None = field(repr=False)  # sqlglot's repr recurses: a long chain overflows it
    tokens: tuple[Token, ...] = field(default=(), repr=False)

    @property
    def is_true(self) -> bool:
        """Matches every row (``None``, empty, ``TRUE``)."""
        return self.text is None

    @property
    def opaque(self) -> bool:
        """DuckDB parses it but sqlglot does not: only its text is usable."""
        return self.text is not None and self.tree is None

    @property
    def sql(self) -> str:
        """The DuckDB text, parenthesised (``TRUE`` for every row)."""
        return "TRUE" if self.text is None else f"({self.text})"

    @functools.cached_property
    def columns(self) -> frozenset[str]:
        """Every name a column reference uses (qualifiers and struct parts too: a superset)."""
        if self.tree is None:
            return frozenset(t.text for t in self.tokens if t.token_type in (TokenType.VAR, TokenType.IDENTIFIER))
        return frozenset(p.name for c in self.tree.find_all(exp.Column) for p in c.parts)

    @property
    def shape(self) -> str:
        """The text with numeric literals as ``#`` (see :func:`shape`)."""
        return shape(self.text) if self.text is not None else "TRUE"

    # pushdown -----------------------------------------------------------------------------
    def to_pyarrow(self, schema: pa.Schema | None = None) -> pc.Expression:
        """The ``pyarrow.compute`` expression; with ``schema`` also bound (type-checked) against it.

        Raises :class:`Untranslatable` outside the simple subset, or when binding fails (e.g. a
        timestamp compared with a string: DuckDB casts, pyarrow does not).
        """
        if self.tree is None:
            if self.text is None:
                raise Untranslatable("every row: no expression needed")
            raise Untranslatable(f"sqlglot cannot parse {self.text!r}")
        try:
            expr = Translate(PyArrowBuild()).build(self.tree)
        except (TypeError, ValueError, pa.ArrowException) as e:
            raise Untranslatable(str(e)) from e
        except RecursionError:  # within the limits this does not happen; DuckDB evaluates the text then
            raise Untranslatable("too deeply nested to translate") from None
        if schema is not None:
            try:
                bind(expr, schema)
            except (pa.ArrowException, TypeError, ValueError) as e:
                raise Untranslatable(f"{self.text!r} does not bind to the schema: {e}") from e
        return expr

    def to_ray(self) -> Any:
        """The ``ray.data.expressions`` predicate (same subset as :meth:`to_pyarrow`); needs Ray Data."""
        if self.tree is None:
            raise Untranslatable(f"cannot translate {self.text!r}")
        return Translate(RayBuild()).build(self.tree)

    # conjuncts and bounds ------------------------------------------------------------------
    def conjuncts(self) -> tuple[exp.Expression, ...]:
        """The top-level AND terms, parentheses opened; OR terms are left out (a top-level OR gives ``()``)."""
        if self.tree is None:
            return ()
        # an OR constrains nothing on its own; iterative, as a chain of 2,000 ANDs is 2,000 levels deep
        return tuple(n for n in operands(self.tree, exp.And) if not isinstance(n, exp.Or))

    def bounds(self, column: str) -> tuple[Bound, ...]:
        """Integer constraints on ``column`` (case-insensitive, at most one qualifier) in the top-level ANDs."""
        out = []
        for c in self.conjuncts():
            b = _bound(c, column.lower())
            if b is not None:
                out.append(b)
        return tuple(out)


def _column_qualifier(node: exp.Expression, column: str) -> str | None:
    """``node``'s qualifier text when it is (optionally one-level qualified) ``column``, else None."""
    if not isinstance(node, exp.Column) or node.name.lower() != column or node.args.get("db") is not None:
        return None
    table = node.args.get("table")
    if table is None:
        return ""
    return (f'"{table.name}".' if table.args.get("quoted") else f"{table.name}.")


def _int(node: exp.Expression) -> int | None:
    neg = False
    if isinstance(node, exp.Neg):
        node, neg = node.this, True
    if isinstance(node, exp.Literal) and not node.is_string and str(node.this).isdigit():
        v = int(node.this)
        return -v if neg else v
    return None


def _bound(node: exp.Expression, column: str) -> Bound | None:
    op = CMP_OPS.get(type(node))
    if op is not None and op != "!=":
        q = _column_qualifier(node.this, column)
        v = _int(node.expression)
        if q is None or v is None:  # the mirrored form: 15 <= policy_version
            q, v, op = _column_qualifier(node.expression, column), _int(node.this), _FLIP[op]
        return None if q is None or v is None else Bound(op, (v,), q)
    if isinstance(node, exp.Between) and not node.args.get("symmetric"):
        q, lo, hi = _column_qualifier(node.this, column), _int(node.args["low"]), _int(node.args["high"])
        return None if q is None or lo is None or hi is None else Bound("between", (lo, hi), q)
    if isinstance(node, exp.In) and node.expressions and not node.args.get("query"):
        q = _column_qualifier(node.this, column)
        vals = [_int(v) for v in node.expressions]
        return None if q is None or any(v is None for v in vals) else Bound("in", tuple(vals), q)  # type: ignore[arg-type]
    return None


def _bucket_hint(b: Bound, bucket_column: str, size: int) -> str:
    col = f"{b.qualifier}{bucket_column}"
    if b.op == "between":
        return f"{col} BETWEEN {b.values[0] // size} AND {b.values[1] // size}"
    if b.op == "in":
        return f"{col} IN ({', '.join(map(str, sorted({v // size for v in b.values})))})"
    v = b.values[0]
    if b.op == ">=":
        return f"{col} >= {v // size}"
    if b.op == ">":
        return f"{col} >= {(v + 1) // size}"
    if b.op == "=":
        return f"{col} = {v // size}"
    if b.op == "<=":
        return f"{col} <= {v // size}"
    return f"{col} <= {(v - 1) // size}"  # "<"


def partition_hint(where: str | Where | None, column: str = "policy_version", bucket_column: str = "policy_bucket",
                   bucket_size: int = 1) -> str | None:
    """``where`` with redundant ``bucket_column`` predicates ANDed for its integer constraints on ``column``.

    ``bucket_column = column // bucket_size``; engines that prune only on hive partition columns
    (DuckDB ``read_parquet``, polars) then skip other buckets. Constraints count only in top-level
    ANDs (>=, >, =, <=, <, BETWEEN, IN with integer literals); anything else, a top-level OR or a
    text that does not parse leaves ``where`` as it is.
    """
    text = where.text if isinstance(where, Where) else where
    if not text or not text.strip():
        return text
    try:
        parsed = where if isinstance(where, Where) else parse(text)
    except QueryError:
        return text
    hints: list[str] = []
    for b in parsed.bounds(column):
        h = _bucket_hint(b, bucket_column, int(bucket_size))
        if h not in hints:
            hints.append(h)
    return text.rstrip() + "".join(f" AND {h}" for h in hints) if hints else text


def _parse(text: str, what: str, composed: bool = False) -> Where:
    """``_parse_checked`` with its limits: the text's length is checked before it is tokenized (a
    user's text; SQL the library composed around a checked where gets room for its own parts)."""
    if len(text) > MAX_WHERE_CHARS * (2 if composed else 1):  # composed: a checked where + the samplers' parts
        raise _too_long(text, what)
    try:
        return _parse_checked(text, what, composed)
    except RecursionError:
        raise _too_deep(text, what) from None


@functools.lru_cache(maxsize=1024)
def _parse_checked(text: str, what: str, composed: bool = False) -> Where:
    tokens = _tokens(text)
    if any(t.token_type == TokenType.SEMICOLON for t in tokens):
        raise QueryError(f"{what} must be a single SQL expression (no ';'), got {text[:200]!r}")
    if not tokens:
        return Where(None, None)
    # composed SQL = a checked where (within the limits) + the samplers' own few levels and tokens
    _check_size(tokens, text, what, composed)
    try:
        trees = _DIALECT.parser().parse(tokens, text)
    except ParseError as e:
        why = _duckdb_accepts(text)
        if why is not None:
            raise QueryError(f"{what} is not a valid SQL expression: {text!r}: {why}") from e
        _check_opaque(tokens, text, what, composed)
        return Where(text, None, tuple(tokens))
    if len(trees) != 1 or trees[0] is None:
        raise QueryError(f"{what} must be exactly one SQL expression, got {text!r}")
    tree = trees[0]
    _check_tree(tree, text, what, composed)
    if isinstance(tree, exp.Boolean) and tree.this is True:
        return Where(None, None)
    return Where(text, tree, tuple(tokens))


def parse(where: str | None, what: str = "a where predicate") -> Where:
    """The parsed, checked ``where`` (cached per text). ``None``, empty and ``TRUE`` match every row.

    Raises ``QueryError`` naming the problem for anything but one expression over the row's columns.
    """
    if where is None:
        return Where(None, None)
    if not isinstance(where, str):
        where = str(where)
    text = where.strip()
    if not text:
        return Where(None, None)
    return _parse(text, what)


@functools.lru_cache(maxsize=1024)
def shape(sql: str) -> str:
    """``sql``'s tokens with numeric literals as ``#``: equal for texts that differ only in numbers.

    Token-level only (no validity check): the samplers key their caches with it on predicates
    they composed themselves from a checked ``where`` and trusted SQL (e.g. an exclusion subquery).
    """
    return _shape(sql, keep_strings=True)


@functools.lru_cache(maxsize=1024)
def binding_shape(sql: str) -> str:
    """``sql``'s tokens with every literal (numbers and strings) as ``#``: texts with the same binding
    shape name the same columns and functions, so they bind to the same relations."""
    return _shape(sql, keep_strings=False)


def _shape(sql: str, keep_strings: bool) -> str:
    try:
        tokens = _DIALECT.tokenize(sql)
    except TokenError:
        return sql
    out = []
    for t in tokens:
        if t.token_type == TokenType.NUMBER or (t.token_type == TokenType.STRING and not keep_strings):
            out.append("#")
        elif t.token_type == TokenType.STRING:
            out.append("'" + t.text.replace("'", "''") + "'")
        elif t.token_type == TokenType.IDENTIFIER:
            out.append('"' + t.text.replace('"', '""') + '"')
        else:
            out.append(t.text)
    return " ".join(out) if out else "TRUE"


def check(where: str | None, *, composed: bool = False) -> str:
    """The checked predicate as DuckDB text, parenthesised; ``TRUE`` for every row.

    ``composed=True`` is for SQL the library built around a checked ``where`` (what the catalog
    receives from the samplers): subqueries over the catalog's own tables are allowed there;
    statements, file and table functions, and string paths in ``FROM`` are still refused.
    """
    if composed:
        text = "" if where is None else str(where).strip()
        return _parse(text, "a where predicate", True).sql if text else "TRUE"
    return parse(where).sql


def check_expression(expr: str, what: str) -> str:
    """A user SQL expression that is not a filter (a priority, an ordering column), checked like a where."""
    if not isinstance(expr, str) or not expr.strip():
        raise ValueError(f"{what} must be a non-empty SQL expression")
    p = _parse(expr.strip(), what)
    return p.sql if p.text is not None else f"({expr.strip()})"


def bind(expr: pc.Expression, schema: pa.Schema) -> None:
    """Bind ``expr`` against ``schema`` (raises on unknown columns or mismatched types)."""
    out = ds.dataset(schema.empty_table()).to_table(filter=expr)
    if out.num_rows:  # pragma: no cover - an empty table filters to nothing
        raise ValueError("an empty table filtered to rows")
