"""Issue 26 item 2: a lake URL that does not exist is a ``LakeError``, never an empty lake.

Readers (``open_lake``, ``lakebuffer sql/stats LAKE``) refuse a URL that does not exist; a writer's
``lake=`` may be a new lake only under an existing location (local: its parent directory; S3: an
existing bucket, any prefix) unless ``create_lake=True``.
"""

from __future__ import annotations

import pytest

import lakebuffer as lb
from lakebuffer.errors import LakeError
from tests.rollouts import make_rollouts
from tests.test_lake_fsck import run


def test_open_lake_of_a_missing_path_is_a_lake_error(tmp_path):
    for url in (str(tmp_path / "typo"), (tmp_path / "typo").as_uri()):
        with pytest.raises(LakeError, match="does not exist"):
            lb.ReplayBuffer.open_lake(url)
    (tmp_path / "empty").mkdir()  # an existing location without a table is an empty lake, as before
    with lb.ReplayBuffer.open_lake(str(tmp_path / "empty")) as view:
        assert view.runs == []


def test_cli_sql_stats_and_restore_of_a_missing_lake_fail_with_lake_error(tmp_path):
    for cmd in (["sql", str(tmp_path / "typo"), "SELECT 1"], ["stats", (tmp_path / "typo").as_uri()],
                ["restore", str(tmp_path / "x"), "--lake", str(tmp_path / "typo"), "--run-id", "r"]):
        code, _, err = run(*cmd)
        assert code == 1 and "LakeError" in err and "does not exist" in err.replace("\n", " "), err


def test_writer_lake_under_a_missing_parent_is_refused_unless_create_lake(tmp_path):
    lake = tmp_path / "no" / "such" / "lake"
    with pytest.raises(LakeError, match="parent directory .* does not exist"):
        lb.ReplayBuffer.open(tmp_path / "a", lake=str(lake), snapshot_interval_s=0)
    assert not (tmp_path / "no").exists()
    with lb.ReplayBuffer.open(tmp_path / "a", lake=str(tmp_path / "lake"), snapshot_interval_s=0) as buf:
        buf.push(make_rollouts(10))  # the parent exists: a new lake is fine (created at the first snapshot)
        buf.snapshot(wait=True)
    with lb.ReplayBuffer.open(tmp_path / "b", lake=str(lake), snapshot_interval_s=0, create_lake=True) as buf:
        buf.push(make_rollouts(10))
        buf.snapshot(wait=True)
    with lb.ReplayBuffer.open_lake(str(lake)) as view:
        assert view.sql("SELECT count(*) AS n FROM rollouts").to_pylist() == [{"n": 10}]


def test_s3_missing_bucket_is_an_error_and_a_new_prefix_is_a_location(s3_server, s3_bucket, tmp_path):
    so = s3_server.storage_options
    with pytest.raises(LakeError, match="does not exist"):
        lb.ReplayBuffer.open_lake("s3://no-such-bucket-lakebuffer/lake", storage_options=so)
    with pytest.raises(LakeError, match="does not exist"):
        lb.ReplayBuffer.open(tmp_path / "a", lake="s3://no-such-bucket-lakebuffer/lake", storage_options=so,
                             snapshot_interval_s=0)
    with pytest.raises(LakeError, match="does not exist"):  # a reader: nothing under the prefix (a typo)
        lb.ReplayBuffer.open_lake(f"{s3_bucket}/typo", storage_options=so)
    with lb.ReplayBuffer.open(tmp_path / "b", lake=f"{s3_bucket}/new/prefix", storage_options=so,
                              snapshot_interval_s=0) as buf:  # a writer: any prefix of an existing bucket
        buf.push(make_rollouts(10))
        buf.snapshot(wait=True)
    with lb.ReplayBuffer.open_lake(f"{s3_bucket}/new/prefix", storage_options=so) as view:
        assert len(view.sql("SELECT key FROM rollouts")) == 10
