"""A parsed ``where`` (sqlglot AST) -> a pushdown expression: ``pyarrow.compute`` or ``ray.data.expressions``.

The simple subset only (comparisons, AND/OR/NOT, IN lists, BETWEEN, IS NULL on plain columns and literals);
anything else raises :class:`Untranslatable` and the caller evaluates the SQL text instead. A layer under
``predicate.py``, which parses and checks the text.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

__all__ = ["Untranslatable"]

class Untranslatable(Exception):
    """The predicate uses something the pushdown subset lacks: evaluate its SQL text instead."""


CMP_OPS: dict[type, str] = {exp.EQ: "=", exp.NEQ: "!=", exp.GT: ">", exp.GTE: ">=", exp.LT: "<", exp.LTE: "<="}


class PyArrowBuild:
    """Builds pyarrow compute expressions."""

    def col(self, name: str) -> Any:
        return pc.field(name)

    def lit(self, value: Any) -> Any:
        return pc.scalar(value)

    def cmp(self, op: str, a: Any, b: Any) -> Any:
        return {"=": a.__eq__, "!=": a.__ne__, "<": a.__lt__, "<=": a.__le__, ">": a.__gt__, ">=": a.__ge__}[op](b)

    def and_(self, a: Any, b: Any) -> Any:
        return a & b

    def or_(self, a: Any, b: Any) -> Any:
        return a | b

    def not_(self, a: Any) -> Any:
        return ~a

    def is_null(self, a: Any, negate: bool) -> Any:
        return a.is_valid() if negate else a.is_null()

    def in_(self, a: Any, values: list) -> Any:
        """``x IN (...)`` with SQL's null semantics (NULL stays NULL, so ``NOT IN`` keeps no nulls)."""
        if len(values) <= 32:  # an OR of equalities prunes row groups and partitions best
            return _balanced_or(self, [a == v for v in values])
        return pc.if_else(a.is_valid(), a.isin(values), pa.scalar(None, pa.bool_()))


class RayBuild(PyArrowBuild):
    """Builds ``ray.data.expressions`` predicates (what Ray Data pushes into Parquet reads)."""

    def __init__(self) -> None:
        from ray.data import expressions

        self.x = expressions

    def col(self, name: str) -> Any:
        return self.x.col(name)

    def lit(self, value: Any) -> Any:
        return self.x.lit(value)

    def is_null(self, a: Any, negate: bool) -> Any:
        return a.is_not_null() if negate else a.is_null()

    def in_(self, a: Any, values: list) -> Any:
        return _balanced_or(self, [a == self.x.lit(v) for v in values])


def _balanced_or(build: PyArrowBuild, terms: list) -> Any:
    return _balanced(build.or_, terms)


def _balanced(combine: Any, terms: list) -> Any:
    """``combine`` over ``terms`` as a balanced tree (log depth: a long chain must not recurse deeply)."""
    while len(terms) > 1:
        terms = [combine(terms[i], terms[i + 1]) if i + 1 < len(terms) else terms[i] for i in range(0, len(terms), 2)]
    return terms[0]


def operands(node: exp.Expression, op: type) -> list[exp.Expression]:
    """The operands of a chain of ``op`` (AND or OR) in order, parentheses opened, without recursion."""
    out: list[exp.Expression] = []
    stack = [node]
    while stack:
        n = stack.pop()
        while isinstance(n, exp.Paren):
            n = n.this
        if isinstance(n, op):
            stack.append(n.expression)  # popped after ``this``: the order stays left to right
            stack.append(n.this)
        else:
            out.append(n)
    return out


def _number(text: str) -> int | float:
    return float(text) if any(c in text for c in ".eE") else int(text)


class Translate:
    """The simple subset of the AST -> a builder's expression; anything else raises ``Untranslatable``."""

    def __init__(self, build: PyArrowBuild) -> None:
        self.b = build

    def build(self, node: exp.Expression) -> Any:
        b = self.b
        if isinstance(node, exp.Paren):
            return self.build(node.this)
        if isinstance(node, exp.And):
            return _balanced(b.and_, [self.build(n) for n in operands(node, exp.And)])
        if isinstance(node, exp.Or):
            return _balanced(b.or_, [self.build(n) for n in operands(node, exp.Or)])
        if isinstance(node, exp.Not):
            inner = node.this
            if isinstance(inner, exp.Is) and isinstance(inner.expression, exp.Null):  # x IS NOT NULL
                return b.is_null(self.operand(inner.this), True)
            return b.not_(self.build(inner))
        op = CMP_OPS.get(type(node))
        if op is not None:
            return b.cmp(op, self.operand(node.this), self.operand(node.expression))
        if isinstance(node, exp.Is):
            if not isinstance(node.expression, exp.Null):
                raise Untranslatable(f"IS {node.expression.sql('duckdb')}")
            return b.is_null(self.operand(node.this), False)
        if isinstance(node, exp.In):
            if not node.expressions or node.args.get("query") is not None or node.args.get("unnest") is not None:
                raise Untranslatable("IN without a value list")
            return b.in_(self.operand(node.this), [self.literal(v) for v in node.expressions])
        if isinstance(node, exp.Between):
            if node.args.get("symmetric"):
                raise Untranslatable("BETWEEN SYMMETRIC")
            left = self.operand(node.this)
            lo, hi = self.operand(node.args["low"]), self.operand(node.args["high"])
            return b.and_(b.cmp(">=", left, lo), b.cmp("<=", left, hi))
        return self.operand(node)

    def operand(self, node: exp.Expression) -> Any:
        if isinstance(node, exp.Paren):
            return self.build(node.this)
        if isinstance(node, exp.Column):
            if node.args.get("table") is not None:
                raise Untranslatable(f"qualified column {node.sql('duckdb')}")
            return self.b.col(node.name)
        if isinstance(node, exp.Null):
            return self.b.lit(None)
        if isinstance(node, (exp.Literal, exp.Boolean, exp.Neg)):
            return self.b.lit(self.literal(node))
        if isinstance(node, (exp.And, exp.Or, exp.Not, exp.Is, exp.In, exp.Between)) or type(node) in CMP_OPS:
            raise Untranslatable(f"unparenthesised {type(node).__name__} operand")
        raise Untranslatable(f"{type(node).__name__} ({node.sql('duckdb')})")

    @staticmethod
    def literal(node: exp.Expression) -> Any:
        if isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal) and not node.this.is_string:
            return -_number(str(node.this.this))
        if isinstance(node, exp.Literal):
            return str(node.this) if node.is_string else _number(str(node.this))
        if isinstance(node, exp.Boolean):
            return bool(node.this)
        raise Untranslatable(f"literal expected, got {node.sql('duckdb')}")
