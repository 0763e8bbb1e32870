"""``prune_hint``: hidden partitioning for SQL text. Adds redundant ``policy_bucket`` predicates for
the top-level integer comparisons on ``policy_version`` of a ``where``, so engines that prune only on
hive columns (DuckDB read_parquet, polars) skip other buckets.

Moved as it was from ``lake.py``; ``lakebuffer.predicate`` (one sqlglot AST) replaces this module.
Self-contained on purpose: nothing but the regexes below and ``prune_hint``.
"""

from __future__ import annotations

import re

_TOKEN = re.compile(
    r"""(?P<str>'(?:[^']|'')*')|(?P<qid>"(?:[^"]|"")*")|(?P<lp>\()|(?P<rp>\))|(?P<word>[A-Za-z_][A-Za-z0-9_$]*)|(?P<ws>\s+)|(?P<other>.)""",
    re.S,
)
_COL = r'(?P<q>(?:(?:[A-Za-z_]\w*|"(?:[^"]|"")+")\.)?)(?:policy_version|"policy_version")'
_INT = r"[+-]?\d+"
_CMP = re.compile(rf"^{_COL}\s*(?P<op>>=|<=|==|=|>|<)\s*(?P<v>{_INT})$", re.I | re.S)
_CMP_REV = re.compile(rf"^(?P<v>{_INT})\s*(?P<op>>=|<=|==|=|>|<)\s*{_COL}$", re.I | re.S)
_BETWEEN = re.compile(rf"^{_COL}\s+BETWEEN\s+(?P<a>{_INT})\s+AND\s+(?P<b>{_INT})$", re.I | re.S)
_IN = re.compile(rf"^{_COL}\s+IN\s*\((?P<vals>\s*{_INT}(?:\s*,\s*{_INT})*\s*)\)$", re.I | re.S)
_FLIP = {">": "<", "<": ">", ">=": "<=", "<=": ">=", "=": "=", "==": "="}


def _split_and(text: str) -> list[str] | None:
    """Top-level AND conjuncts of a SQL predicate, or None when it has a top-level OR."""
    parts, depth, start, between = [], 0, 0, False
    for m in _TOKEN.finditer(text):
        kind = m.lastgroup
        if kind == "lp":
            depth += 1
        elif kind == "rp":
            depth -= 1
        elif kind == "word" and depth == 0:
            w = m.group().upper()
            if w == "OR":
                return None
            if w == "BETWEEN":
                between = True
            elif w == "AND":
                if between:
                    between = False
                else:
                    parts.append(text[start : m.start()])
                    start = m.end()
    parts.append(text[start:])
    return [p.strip() for p in parts]


def _strip_parens(text: str) -> str | None:
    """The inside of ``( ... )`` when the parentheses enclose the whole text, else None."""
    if not (text.startswith("(") and text.endswith(")")):
        return None
    depth = 0
    for m in _TOKEN.finditer(text):
        if m.lastgroup == "lp":
            depth += 1
        elif m.lastgroup == "rp":
            depth -= 1
            if depth == 0 and m.end() != len(text):
                return None
    return text[1:-1].strip()


def _conjuncts(text: str) -> list[str]:
    parts = _split_and(text)
    if parts is None:
        return []
    out = []
    for p in parts:
        inner = _strip_parens(p)
        out.extend(_conjuncts(inner) if inner is not None else [p])
    return out


def _bucket_hint(q: str, op: str, v: int, size: int) -> str:
    col = f"{q}policy_bucket"
    if op == ">=":
        return f"{col} >= {v // size}"
    if op == ">":
        return f"{col} >= {(v + 1) // size}"
    if op in ("=", "=="):
        return f"{col} = {v // size}"
    if op == "<=":
        return f"{col} <= {v // size}"
    return f"{col} <= {(v - 1) // size}"  # "<"


def prune_hint(where: str, policy_bucket_size: int) -> str:
    """``where`` with redundant ``policy_bucket`` predicates ANDed for its top-level integer
    comparisons on ``policy_version`` (>=, >, =, <=, <, BETWEEN, IN). Anything else is left as is; a
    predicate with a top-level OR is returned unchanged."""
    if not where or not where.strip():
        return where
    size = policy_bucket_size
    hints: list[str] = []
    for c in _conjuncts(where.strip()):
        hint = None
        if m := _CMP.match(c):
            hint = _bucket_hint(m.group("q"), m.group("op"), int(m.group("v")), size)
        elif m := _CMP_REV.match(c):
            hint = _bucket_hint(m.group("q"), _FLIP[m.group("op")], int(m.group("v")), size)
        elif m := _BETWEEN.match(c):
            a, b = int(m.group("a")), int(m.group("b"))
            hint = f"{m.group('q')}policy_bucket BETWEEN {a // size} AND {b // size}"
        elif m := _IN.match(c):
            vals = sorted({int(v) // size for v in m.group("vals").split(",")})
            hint = f"{m.group('q')}policy_bucket IN ({', '.join(map(str, vals))})"
        if hint and hint not in hints:
            hints.append(hint)
    if not hints:
        return where
    return where.rstrip() + "".join(f" AND {h}" for h in hints)
