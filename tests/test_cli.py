"""Every CLI command through the real entry point (a subprocess), with an error case each."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import lakebuffer as lb
from tests.rollouts import make_rollouts

ROOT = Path(__file__).resolve().parent.parent


def cli(*args: str, env: dict | None = None, timeout: int = 240) -> subprocess.CompletedProcess:
    import os

    e = {**os.environ, "COLUMNS": "200", **(env or {})}
    return subprocess.run([sys.executable, "-m", "lakebuffer.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=e)


@pytest.fixture()
def filled(tmp_path):
    path = tmp_path / "buf"
    with lb.ReplayBuffer.open(path, memory_limit_mb=1, snapshot_interval_s=0, run_id="cli") as buf:
        for v in range(4):
            buf.push(make_rollouts(64, tokens=256, version=v, seed=v))
    return path


def test_help_lists_every_command():
    r = cli("--help")
    assert r.returncode == 0
    for cmd in ("demo", "sql", "stats", "snapshot", "compact", "restore", "fsck", "bench"):
        assert cmd in r.stdout


def test_demo_runs_on_embedded_defaults(tmp_path):
    r = cli("demo", "--dir", str(tmp_path / "demo"), "--total-mb", "24", "--memory-limit-mb", "8")
    assert r.returncode == 0, r.stderr
    assert "sample(8" in r.stdout and "warm" in r.stdout
    assert "push rollouts" in r.stderr  # the progress bar


@pytest.mark.slow  # ~7 s of subprocess CLI runs (make test-slow)
def test_sql_prints_table_and_formats(filled, tmp_path):
    r = cli("sql", str(filled), "SELECT policy_version, count(*) AS n FROM rollouts GROUP BY 1 ORDER BY 1")
    assert r.returncode == 0, r.stderr
    assert "policy_version" in r.stdout and "64" in r.stdout
    r = cli("sql", str(filled), "SELECT policy_version, count(*) AS n FROM rollouts GROUP BY 1 ORDER BY 1", "--format", "json")
    assert json.loads(r.stdout) == [{"policy_version": v, "n": 64} for v in range(4)]
    r = cli("sql", str(filled), "SELECT key, response_ids FROM rollouts LIMIT 2", "--format", "csv")
    assert r.returncode == 0 and r.stdout.splitlines()[0].replace('"', "") == "key,response_ids"
    out = tmp_path / "o.parquet"
    r = cli("sql", str(filled), "SELECT key FROM rollouts", "--format", "parquet", "--out", str(out))
    import pyarrow.parquet as pq

    assert r.returncode == 0 and pq.read_table(out).num_rows == 256
    q = tmp_path / "q.sql"
    q.write_text("SELECT count(*) AS n FROM rollouts")
    r = cli("sql", str(filled), "--file", str(q), "--format", "json")
    assert json.loads(r.stdout) == [{"n": 256}]


def test_sql_error_is_one_line_and_nonzero(filled):
    r = cli("sql", str(filled), "SELECT no_such FROM rollouts")
    assert r.returncode == 1
    assert "QueryError" in r.stderr and "Traceback" not in r.stderr
    r = cli("sql", "/no/such/dir", "SELECT 1")
    assert r.returncode == 1 and "Traceback" not in r.stderr


def test_stats_table_and_json(filled):
    r = cli("stats", str(filled))
    assert r.returncode == 0 and "hot" in r.stdout and "warm" in r.stdout and "cold" in r.stdout
    r = cli("stats", str(filled), "--json")
    st = json.loads(r.stdout)
    assert st["hot"]["rows"] + st["warm"]["rows"] == 256
    assert cli("stats", "/no/such/dir").returncode == 1


@pytest.mark.slow  # ~7 s of subprocess CLI runs (make test-slow)
def test_snapshot_restore_compact(filled, tmp_path):
    lake = tmp_path / "lake"
    r = cli("snapshot", str(filled), "--lake", str(lake))
    assert r.returncode == 0, r.stderr
    r = cli("snapshot", str(filled), "--lake", str(lake))
    assert "nothing new" in r.stdout
    r = cli("compact", str(filled), "--lake", str(lake))
    assert r.returncode == 0, r.stderr
    dst = tmp_path / "restored"
    r = cli("restore", str(dst), "--lake", str(lake), "--run-id", "cli")
    assert r.returncode == 0, r.stderr
    assert "restored 256 rollouts" in r.stdout
    r = cli("sql", str(lake), "SELECT count(*) AS n FROM rollouts", "--format", "json")
    assert json.loads(r.stdout) == [{"n": 256}]  # a lake URL works as a source too
    r = cli("restore", str(tmp_path / "x"), "--lake", str(tmp_path / "nolake"), "--run-id", "nobody")
    assert r.returncode == 1 and "nobody" in r.stderr  # nothing to restore is an error, not an empty dir


def test_env_vars_configure_commands(filled, tmp_path):
    lake = tmp_path / "envlake"
    r = cli("snapshot", str(filled), env={"LAKEBUFFER_LAKE": str(lake)})
    assert r.returncode == 0, r.stderr
    assert list(lake.rglob("*.parquet"))


def test_fsck_ok_and_broken(filled):
    r = cli("fsck", str(filled), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["ok"] is True
    seg = sorted((filled / "wal").glob("*.arrow"))
    assert seg, "the fixture leaves hot batches (with WAL segments)"
    seg[0].unlink()  # a hot batch loses its WAL segment
    r = cli("fsck", str(filled), "--json")
    assert r.returncode == 1 and json.loads(r.stdout)["ok"] is False
    r = cli("fsck", str(filled), "--repair")
    assert r.returncode == 0
    assert json.loads(cli("fsck", str(filled), "--json").stdout)["ok"] is True
    assert cli("fsck", "/no/such/dir").returncode == 1


def test_debug_shows_traceback(filled):
    r = cli("--debug", "sql", str(filled), "SELECT no_such FROM rollouts")
    assert r.returncode != 0 and "Traceback" in r.stderr


@pytest.mark.slow  # ~5 s of a quick bench (tests/test_bench.py covers the scenarios in make test)
def test_bench_quick_through_the_cli_and_a_bad_scenario(tmp_path):
    out = tmp_path / "b.json"
    r = cli("bench", "--quick", "--scenario", "limits", "--out", str(out))
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert "limits" in res["scenarios"] and res["quick"] is True
    r = cli("bench", "--quick", "--scenario", "no-such-scenario")
    assert r.returncode == 1 and "Traceback" not in r.stderr


def test_demo_bad_budget_and_toml_config(tmp_path):
    r = cli("demo", "--dir", str(tmp_path / "d"), "--memory-limit-mb", "-1")
    assert r.returncode == 1 and "memory_limit_mb" in r.stderr and "Traceback" not in r.stderr
    src = tmp_path / "buf"
    with lb.ReplayBuffer.open(src, memory_limit_mb=4, snapshot_interval_s=0, run_id="toml") as buf:
        buf.push(make_rollouts(16, tokens=8))
    cfg = tmp_path / "lb.toml"
    lake = tmp_path / "toml-lake"
    cfg.write_text(f'[lakebuffer]\nlake = "{lake}"\n')
    r = cli("--config", str(cfg), "snapshot", str(src))
    assert r.returncode == 0, r.stderr
    assert list(lake.rglob("*.parquet"))


def test_sql_analysis_query_by_name_and_unknown_name(filled):
    r = cli("sql", str(filled), "--query", "policy_lag", "--format", "json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert rows and {"lag", "rollouts"} <= set(rows[0])
    r = cli("sql", str(filled), "--query", "no_such_analysis")
    assert r.returncode == 1 and "policy_lag" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow  # ~7 s of subprocess CLI runs (make test-slow)
def test_stats_shows_the_runs_budget_and_a_lake_title(filled, tmp_path):
    r = cli("stats", str(filled), "--json")
    assert json.loads(r.stdout)["hot"]["limit_bytes"] == 2**20  # the fixture's memory_limit_mb=1
    assert "1024.0 MB" not in cli("stats", str(filled)).stdout
    lake = tmp_path / "lake"
    assert cli("snapshot", str(filled), "--lake", str(lake)).returncode == 0
    r = cli("stats", str(lake))
    assert r.returncode == 0 and "lakebuffer None" not in r.stdout and str(lake.name) in r.stdout
    assert cli("stats", str(filled), "--json", "true").returncode != 0  # a flag, takes no value


def test_compact_and_fsck_print_text_unless_json(filled, tmp_path):
    r = cli("fsck", str(filled))
    assert r.returncode == 0 and "ok" in r.stdout and not r.stdout.lstrip().startswith("{")
    lake = tmp_path / "lake"
    assert cli("snapshot", str(filled), "--lake", str(lake)).returncode == 0
    r = cli("compact", str(filled), "--lake", str(lake))
    assert r.returncode == 0 and r.stdout.startswith("compaction: ") and "{" not in r.stdout
    r = cli("compact", str(filled), "--lake", str(lake), "--json")
    assert isinstance(json.loads(r.stdout), dict)
