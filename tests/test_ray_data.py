"""to_ray against a real local Ray (num_cpus=2): row counts, projection and predicate pushdown."""

from __future__ import annotations

import contextlib
import io

import numpy as np
import pyarrow.compute as pc
import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("ray.data")

import lakebuffer as lb  # noqa: E402
from lakebuffer.dataset import to_ray  # noqa: E402
from tests.rollouts import make_rollouts  # noqa: E402


@pytest.fixture(scope="module")
def ray_local():
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def lake_url(tmp_path_factory):
    root = tmp_path_factory.mktemp("raylake")
    url = (root / "lake").as_uri()
    for i, run in enumerate(["r1", "r2"]):
        with lb.ReplayBuffer.open(root / run, memory_limit_mb=8, snapshot_interval_s=0, lake=url) as buf:
            buf.push(make_rollouts(256, tokens=8, version=np.arange(256) // 64, seed=i))
            buf.snapshot(wait=True)
    return url


def count(view, where: str | None) -> int:
    return view.sql(f"SELECT count(*) FROM rollouts WHERE {where or 'TRUE'}").column(0)[0].as_py()


def optimized_plan(rds) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rds.explain()
    text = buf.getvalue()
    start = text.index("Logical Plan (Optimized)")
    return text[start : text.index("Physical Plan", start)]


@pytest.mark.parametrize("where", [None, "policy_version >= 2", "run_id = 'r1' AND reward > 0.5",
                                   "policy_version IN (0, 3) AND NOT verified"])
def test_row_counts_and_projection(ray_local, lake_url, where):
    with lb.ReplayBuffer.open_lake(lake_url) as view:
        rds = to_ray(view, where=where, columns=["key", "reward"])
        assert rds.count() == count(view, where)
        assert rds.schema().names == ["key", "reward"]
        rows = rds.take_all()
        assert len({r["key"] for r in rows}) == len(rows)


def test_predicate_and_projection_are_pushed_into_the_read(ray_local, lake_url):
    with lb.ReplayBuffer.open_lake(lake_url) as view:
        rds = to_ray(view, where="policy_version >= 2 AND reward > 0.5", columns=["key", "response_ids"])
        plan = optimized_plan(rds)
        assert "ReadFiles" in plan or "ReadParquet" in plan
        assert "Filter" not in plan and "MapBatches" not in plan and "Project" not in plan, plan
        assert rds.count() == count(view, "policy_version >= 2 AND reward > 0.5")


def test_untranslatable_sql_and_pyarrow_expressions_still_filter(ray_local, lake_url):
    with lb.ReplayBuffer.open_lake(lake_url) as view:
        rds = to_ray(view, where="len(response_ids) = 8 AND reward < 0.25", columns=["key"])
        assert "MapBatches" in optimized_plan(rds)  # evaluated by DuckDB after the read
        assert rds.count() == count(view, "len(response_ids) = 8 AND reward < 0.25")
        expr = pc.field("reward") > 0.75
        assert to_ray(view, where=expr, columns=["reward"]).count() == count(view, "reward > 0.75")


def test_tombstones_are_applied(ray_local, tmp_path):
    url = (tmp_path / "lake").as_uri()
    with lb.ReplayBuffer.open(tmp_path / "b", memory_limit_mb=8, snapshot_interval_s=0, lake=url) as buf:
        keys = buf.push(make_rollouts(64, tokens=4))
        buf.snapshot(wait=True)
        buf.delete(keys=keys[:5])
        buf.snapshot(wait=True)
    with lb.ReplayBuffer.open_lake(url) as view:
        got = {r["key"] for r in to_ray(view, columns=["key"]).take_all()}
        assert len(got) == 59 and not got & set(keys[:5].to_pylist())


def test_live_buffer(ray_local, tmp_path):
    with lb.ReplayBuffer.open(tmp_path / "live", memory_limit_mb=8, snapshot_interval_s=0) as buf:
        buf.push(make_rollouts(100, tokens=4, version=np.arange(100) // 50))
        rds = to_ray(buf, where="policy_version = 1", columns=["key", "policy_version"])
        assert rds.count() == 50
        assert {r["policy_version"] for r in rds.take_all()} == {1}
