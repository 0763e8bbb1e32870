"""Locate the declarative files (``schemas/``, ``sql/``) in a checkout or in an installed wheel."""

from __future__ import annotations

from functools import cache
from pathlib import Path

_PKG = Path(__file__).resolve().parent


def resource_dir(name: str) -> Path:
    """``lakebuffer/<name>`` in a wheel (mapped by pyproject), else ``<repo>/<name>`` in a checkout."""
    for base in (_PKG / name, _PKG.parent / name):
        if base.is_dir():
            return base
    raise FileNotFoundError(f"lakebuffer resource folder {name!r} not found next to {_PKG}")


@cache
def sql_text(name: str) -> str:
    """The text of ``sql/<name>.sql`` (queries live there, not in Python strings)."""
    return (resource_dir("sql") / f"{name}.sql").read_text()


def render_sql(name: str, **fields: object) -> str:
    """``sql/<name>.sql`` with its ``{field}`` placeholders filled: the one template syntax of every
    query file (plain replacement, so SQL's own braces, e.g. struct literals, need no escaping)."""
    text = sql_text(name)
    for k, v in fields.items():
        text = text.replace("{" + k + "}", str(v))
    return text


def analysis_sql(name: str) -> Path:
    """The installed ``sql/analysis/<name>.sql`` (``lakebuffer sql DIR --query NAME``)."""
    from .errors import OptionError

    folder = resource_dir("sql") / "analysis"
    path = folder / f"{name}.sql"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in folder.glob("*.sql")))
        raise OptionError(f"no analysis query named {name!r}; installed ones: {known}")
    return path
