"""Smoke run of benchmarks/cold_scale.py (issue 23's done-when bench) at 16 MB: it builds, reuses its
build, and reports every figure on rows both systems agree on. No timing assertion: the figures belong
to the bench. About 8 s on the 2-core machine (two child processes), so it is marked slow."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "cold_scale.py"


def _run(root: Path, *extra: str) -> dict:
    out = root / "out.json"
    subprocess.run([sys.executable, str(SCRIPT), "--root", str(root), "--mb", "16", "--calls", "2", "--keys", "16",
                    "--out", str(out), *extra], check=True, capture_output=True, text=True, timeout=120)
    return json.loads(out.read_text())


@pytest.mark.slow
def test_cold_scale_smoke(tmp_path: Path) -> None:
    doc = _run(tmp_path)
    (r,) = doc["results"]
    assert r["same_rows_round0"] is True  # the Lance copy holds the buffer's rows under the buffer's keys
    assert r["cold_share"] >= 0.7 and r["rows_served_from"]["cold"] > 0
    assert r["get"]["p50_ms"] > 0 and r["lance"]["p50_ms"] > 0 and r["sample"]["p50_ms"] > 0
    assert "error" not in r["reopen"] and "error" not in r["resume"], (r["reopen"], r["resume"])
    assert r["reopen"]["rows"] == r["rows"] == r["resume"]["rows"]
    assert 0 < r["reopen"]["open"]["read_share"] and r["resume"]["until_first"]["read"] > 0
    assert (tmp_path / "out.md").read_text().count("|") > 20
    built = json.loads((tmp_path / "local" / "16mb" / "build.json").read_text())
    again = _run(tmp_path, "--reuse", "--no-children")  # measure only: the same build, nothing pushed
    assert again["results"][0]["rows"] == r["rows"] == built["pushed_rows"]
    assert "reopen" not in again["results"][0]


@pytest.mark.slow
def test_cold_scale_on_moto_counts_the_requests_of_each_call(tmp_path: Path) -> None:
    """``--s3`` builds on a moto server of its own and counts, from its request log, the requests each timed
    call made: a get of cold keys and Lance's take of them both reach the server (the figures that say how
    much of an S3 call is the server's per-request cost)."""
    doc = _run(tmp_path, "--s3", "--no-children")
    (r,) = doc["results"]
    assert r["same_rows_round0"] is True
    requests = r["s3_requests_p50"]
    assert requests["get"] > 0 and requests["lance"] > 0 and requests["lance_sample"] > 0
    assert "S3 requests a call" in (tmp_path / "out.md").read_text()
