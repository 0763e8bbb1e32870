"""Issue 24 item 6: ``fsck DIR --lake L`` verifies the run's lake files; ``fsck LAKE_URL`` verifies every
file of a lake (local path, file://, s3:// on moto), naming damaged files, exit 1, deleting nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import lakebuffer as lb
from lakebuffer.fsck import check
from tests.rollouts import make_rollouts


def run(*args: str) -> tuple[int, str, str]:
    """The CLI in this process (a subprocess start costs seconds here): (exit code, stdout, stderr)."""
    from typer.testing import CliRunner

    from lakebuffer.cli import app

    r = CliRunner().invoke(app, list(args))
    return r.exit_code, r.stdout, r.stderr


def _lake_with_runs(tmp_path: Path) -> tuple[Path, str]:
    lake = str(tmp_path / "lake")
    for run in ("a", "b"):
        with lb.ReplayBuffer.open(tmp_path / run, lake=lake, run_id=run, snapshot_interval_s=0, memory_limit_mb=16) as buf:
            for v in range(2):
                buf.push(make_rollouts(40, version=v, seed=v))
            buf.snapshot(wait=True)
    return tmp_path / "a", lake


def _flip(path: Path) -> None:
    """One byte of a data page changes, size unchanged (what a bad disk or a stray write does)."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_fsck_of_a_buffer_with_lake_names_a_corrupt_lake_file(tmp_path):
    buf_dir, lake = _lake_with_runs(tmp_path)
    assert check(buf_dir, lake=lake)["ok"]
    bad = sorted(Path(lake).glob("run_id=a/*/*.parquet"))[0]
    _flip(bad)
    rep = check(buf_dir, lake=lake)
    assert not rep["ok"] and rep["damaged_files"] == [str(bad)]
    assert any(str(bad) in p and "sha256" in p for p in rep["problems"])
    assert check(buf_dir)["ok"]  # without --lake only the local side is checked (it is intact)
    code, out, _ = run("fsck", str(buf_dir), "--lake", lake, "--json")
    assert code == 1 and json.loads(out)["damaged_files"] == [str(bad)]
    assert bad.exists()  # reported, never deleted


def test_fsck_of_a_lake_url_verifies_every_file_and_deletes_nothing(tmp_path):
    _, lake = _lake_with_runs(tmp_path)
    for url in (lake, Path(lake).as_uri()):
        code, out, err = run("fsck", url, "--json")
        assert code == 0, err
        rep = json.loads(out)
        assert rep["ok"] and rep["runs"] == 2 and rep["files"] == len(list(Path(lake).rglob("*.parquet")))
    bad = sorted(Path(lake).glob("run_id=b/*/*.parquet"))[-1]
    _flip(bad)
    gone = sorted(Path(lake).glob("run_id=a/*/*.parquet"))[0]
    gone.unlink()
    before = sorted(p.name for p in Path(lake).rglob("*"))
    code, out, _ = run("fsck", lake)
    assert code == 1 and "PROBLEMS" in out and "missing" in out and bad.name[:20] in out
    from lakebuffer.fsck import check_lake

    rep = check_lake(Path(lake).as_uri())
    assert not rep["ok"] and sorted(rep["damaged_files"]) == sorted([str(bad), str(gone)])
    assert sorted(p.name for p in Path(lake).rglob("*")) == before  # nothing deleted or moved


def test_fsck_of_a_lake_with_a_damaged_delta_log_names_the_log_file(tmp_path):
    _, lake = _lake_with_runs(tmp_path)
    log = sorted((Path(lake) / "_delta_log").glob("*.json"))[-1]
    log.write_text(log.read_text()[:-40] + "garbage{")
    from lakebuffer.fsck import check_lake

    rep = check_lake(lake)
    assert not rep["ok"] and rep["damaged_files"] == [str(log)]
    assert run("fsck", lake)[0] == 1


def test_fsck_of_something_that_is_no_lake_is_an_error(tmp_path):
    (tmp_path / "empty").mkdir()
    code, _, err = run("fsck", str(tmp_path / "empty"))
    assert code == 1 and "LakeError" in err and "no Delta table" in err.replace("\n", "")
    code, _, err = run("fsck", (tmp_path / "nowhere").as_uri())
    assert code == 1 and "does not exist" in err.replace("\n", "")


@pytest.mark.usefixtures("s3_server")
def test_fsck_of_an_s3_lake_names_the_damaged_object(s3_server, s3_bucket, tmp_path):
    url, so = f"{s3_bucket}/lake", s3_server.storage_options
    with lb.ReplayBuffer.open(tmp_path / "buf", lake=url, storage_options=so, run_id="s3", snapshot_interval_s=0,
                              memory_limit_mb=16) as buf:
        buf.push(make_rollouts(60, version=0))
        buf.snapshot(wait=True)
    code, out, err = run("fsck", url, "--storage-options", json.dumps(so), "--json")
    assert code == 0 and json.loads(out)["ok"], err
    s3 = s3_server.client()
    bucket = s3_bucket[len("s3://"):]
    key = next(o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"] if o["Key"].endswith(".parquet"))
    body = bytearray(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    body[len(body) // 2] ^= 0xFF
    s3.put_object(Bucket=bucket, Key=key, Body=bytes(body))
    code, out, _ = run("fsck", url, "--storage-options", json.dumps(so), "--json")
    assert code == 1 and json.loads(out)["damaged_files"] == [f"s3://{bucket}/{key}"]
    code, out, _ = run("fsck", str(tmp_path / "buf"), "--lake", url, "--storage-options", json.dumps(so), "--json")
    assert code == 1 and json.loads(out)["damaged_files"] == [f"s3://{bucket}/{key}"]
