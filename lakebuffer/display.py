"""Notebook and console output: an informative ``repr`` line and a stats table (``_repr_html_``).

One place renders what ``stats()`` returns, so a buffer and a lake view look alike in Jupyter and
neither reprs as a bare path.
"""

from __future__ import annotations

import html
from typing import Any


def _mb(n: Any) -> str:
    return f"{(n or 0) / 2**20:.1f} MB"


def tier_rows(st: dict[str, Any]) -> list[tuple[str, int, str, Any, str]]:
    """(tier, rows, size, files, detail) for each tier ``stats()`` reports."""
    out = []
    hot, warm, cold = st.get("hot"), st.get("warm"), st.get("cold")
    if hot:
        out.append(("hot", hot["rows"], _mb(hot["bytes"]), hot.get("batches", ""), f"limit {_mb(hot['limit_bytes'])}"))
    if warm:
        out.append(("warm", warm["rows"], _mb(warm["bytes"]), warm.get("fragments", ""), "Arrow IPC fragments (mmapped)"))
    if cold:
        url = cold.get("url") or st.get("url") or "-"
        out.append(("cold", cold.get("rows", 0), _mb(cold.get("bytes", 0)), cold.get("files", 0),
                    f"{url}, last snapshot {cold.get('last_snapshot_id')}"))
        only = cold.get("only")
        if only and only.get("rows"):
            out.append(("cold only", only["rows"], _mb(only["bytes"]), only.get("files", ""),
                        "rows no local tier holds (read from the lake)"))
    return out


def stats_html(title: str, st: dict[str, Any]) -> str:
    """An HTML table of ``st`` (a ``stats()`` result) under ``title``."""
    head = "".join(f"<th>{h}</th>" for h in ("tier", "rows", "size", "files", "detail"))
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row) + "</tr>"
                   for row in tier_rows(st))
    return (f"<div><b>{html.escape(title)}</b><table><thead><tr>{head}</tr></thead>"
            f"<tbody>{body}</tbody></table></div>")
