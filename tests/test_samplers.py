"""Samplers: the plugin interface, every built-in strategy, statistics with fixed seeds, determinism.

One shared buffer holds a small "world" pushed in shuffled batches under a tiny memory budget, so
its rows are spread over the hot and warm tiers and insertion order is unrelated to step order:
* 60 GRPO groups of 8 (group_id g0..g59, policy_version = g % 10, no episode);
* 20 single-agent episodes e0..e19 of 5..15 steps (episodes e0, e4, ... miss step 3);
* 10 multi-agent episodes m0..m9, teams t0/t1 of agents a0..a2, 6 steps (in m0, m3, m6, m9
  agent a1 of team t0 has no row at step 2).
Statistical tests use fixed seeds and hard-coded chi-square critical values (alpha = 0.001,
Wilson-Hilferty), so they are reproducible and would fail on a biased sampler.

Every test that takes ``buf`` runs once per reader (tests/conformance/test_readers.py builds them
over the same world): ReplayBuffer with a ``file://`` lake and with an S3 lake, the read-only
LakeView of the snapshot, and ShardedReplayBuffer. ``@readers(...)`` narrows a test to the readers
whose semantics it holds for, and says why.
"""

from __future__ import annotations

import collections
import contextlib

import numpy as np
import pyarrow as pa
import pytest

import lakebuffer as lb
from lakebuffer.samplers import Sampler
from tests.conformance.test_readers import KINDS, RAY, open_reader, ray_session

T0_US = 1_767_225_600_000_000  # 2026-01-01
META = ["key", "group_id", "episode_id", "team_id", "agent_id", "step", "policy_version", "reward", "advantage",
        "verified", "created_at"]
# chi-square critical values at alpha = 0.001 (Wilson-Hilferty approximation), by degrees of freedom
CHI2_999 = {9: 27.88, 239: 312.4}


def _world(seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    rows: list[dict] = []
    for g in range(60):
        r = rng.random(8)
        for i in range(8):
            rows.append(dict(prompt_id=f"p{g}", group_id=f"g{g}", policy_version=g % 10, reward=r[i],
                             advantage=r[i] - r.mean(), verified=bool(r[i] > 0.8)))
    for e in range(20):
        for s in range(5 + e % 11):
            if e % 4 == 0 and s == 3:
                continue
            rows.append(dict(prompt_id=f"ep{e}", episode_id=f"e{e}", step=s, policy_version=e % 10,
                             reward=rng.random(), advantage=0.0, verified=False))
    for e in range(10):
        for t in range(2):
            for s in range(6):
                for a in range(3):
                    if e % 3 == 0 and t == 0 and s == 2 and a == 1:
                        continue
                    rows.append(dict(prompt_id=f"ma{e}", episode_id=f"m{e}", team_id=f"t{t}", agent_id=f"a{a}",
                                     step=s, policy_version=e % 10, reward=rng.random(), advantage=0.0,
                                     verified=False))
    rows = [rows[i] for i in rng.permutation(len(rows))]
    col = lambda name: [r.get(name) for r in rows]  # noqa: E731
    n = len(rows)
    tokens = pa.array([[1, 2, 3, 4]] * n, pa.list_(pa.int32()))
    versions = np.array(col("policy_version"), dtype=np.int64)
    return pa.table({
        "prompt_id": col("prompt_id"),
        "group_id": [g if g is not None else p for g, p in zip(col("group_id"), col("prompt_id"))],
        "episode_id": pa.array(col("episode_id"), pa.string()),
        "agent_id": pa.array(col("agent_id"), pa.string()),
        "team_id": pa.array(col("team_id"), pa.string()),
        "step": pa.array(col("step"), pa.int64()),
        "policy_version": pa.array(versions),
        "prompt_ids": tokens,
        "response_ids": tokens,
        "reward": pa.array(col("reward"), pa.float32()),
        "advantage": pa.array(col("advantage"), pa.float32()),
        "verified": pa.array(col("verified"), pa.bool_()),
        "created_at": pa.array(T0_US + versions * 60_000_000, pa.timestamp("us", tz="UTC")),
    })


WORLD = _world()


def _open(path, **kw) -> lb.ReplayBuffer:
    kw.setdefault("run_id", "world")  # keys (hence every seeded sample) do not depend on tmp_path
    kw.setdefault("memory_limit_mb", 0.2)
    kw.setdefault("snapshot_interval_s", 0)
    return lb.ReplayBuffer.open(path, **kw)


def _fill(buf: lb.ReplayBuffer, table: pa.Table = WORLD, batch: int = 64) -> None:
    for i in range(0, table.num_rows, batch):
        buf.push(table.slice(i, batch))


AVAILABLE = tuple(k for k in KINDS if RAY or k != "sharded")


def readers(*kinds: str, why: str):
    """Run the decorated test only under ``kinds`` (``why``: what the other readers do differently)."""

    def mark(fn):
        fn.readers = kinds
        fn.readers_why = why
        return fn

    return mark


def pytest_generate_tests(metafunc):
    """Parametrize ``buf`` by reader; a reader a test is not meant for is listed as skipped, with why."""
    if "buf" in metafunc.fixturenames:
        meant = getattr(metafunc.function, "readers", KINDS)
        why = getattr(metafunc.function, "readers_why", "")
        params = [k if k in meant else pytest.param(k, marks=pytest.mark.skip(reason=why)) for k in AVAILABLE]
        metafunc.parametrize("buf", params, indirect=True, scope="module")


@pytest.fixture(scope="module")
def buf(request, tmp_path_factory):
    """The world in one reader of each kind (built once per module and kind)."""
    kind = request.param
    with contextlib.ExitStack() as stack:
        if kind == "sharded":
            stack.enter_context(ray_session())
        s3 = request.getfixturevalue("s3_server") if kind == "s3" else None
        root = tmp_path_factory.mktemp(f"samplers-{kind}")
        # write-back done (flushed): about half the budget stays hot, the rest is warm
        b = stack.enter_context(open_reader(kind, WORLD, root, s3_server=s3, run_id="world", memory_limit_mb=0.2))
        if kind in ("local", "s3"):
            st = b.stats()
            assert st["hot"]["rows"] > 0 and st["warm"]["rows"] > 0, "rows should span the hot and warm tiers"
        yield b


def keys_of(buf, n, **kw) -> list[str]:
    return buf.sample(n, return_keys=True, **kw).to_pylist()


def rows_of(buf, n, **kw) -> list[dict]:
    return buf.sample(n, columns=META, **kw).to_pylist()


def table(buf, where="TRUE") -> list[dict]:
    return buf.sql(f"SELECT {', '.join(META)} FROM meta WHERE {where}").to_pylist()


def chi_square(observed, expected) -> float:
    o, e = np.asarray(observed, float), np.asarray(expected, float)
    return float(((o - e) ** 2 / e).sum())


# --- registry and plugin interface ------------------------------------------------------------------
def test_every_strategy_is_registered():
    assert set(lb.samplers.names()) >= {"uniform", "prioritized_time", "freshness", "reward", "success_blend",
                                        "group", "episode", "segment", "team", "max_reuse", "priority"}


def test_get_builds_by_name_with_options(buf):
    s = lb.samplers.get("freshness", max_lag=1, current_version=9)
    assert isinstance(s, lb.samplers.FreshnessSampler) and (s.max_lag, s.current_version) == (1, 9)
    got = buf.sample(20, sampler=s, columns=["policy_version"]).column(0).to_pylist()
    assert len(got) == 20 and min(got) >= 8
    with pytest.raises(ValueError, match="unknown sampler"):
        lb.samplers.get("no_such_sampler")
    with pytest.raises(TypeError):
        buf.sample(2, sampler=s, max_lag=3)  # options go to the constructor, not with an instance


def test_a_users_own_sampler_is_used_by_name(buf):
    class SmallestKeys(Sampler):
        def __init__(self, offset: int = 0):
            self.offset = offset

        def sample(self, catalog, n, where, rng):
            sql = f"SELECT key FROM meta WHERE {where or 'TRUE'} ORDER BY key LIMIT {n} OFFSET {self.offset}"
            return catalog.query(sql, sync=False).column("key").combine_chunks()

    lb.samplers.register("smallest_keys", SmallestKeys)
    expected = [r["key"] for r in buf.sql("SELECT key FROM meta ORDER BY key LIMIT 5").to_pylist()]
    assert keys_of(buf, 3, sampler="smallest_keys") == expected[:3]
    assert keys_of(buf, 3, sampler="smallest_keys", offset=2) == expected[2:5]
    assert buf.sample(2, sampler=SmallestKeys, columns=["key"]).column(0).to_pylist() == expected[:2]
    with pytest.raises(TypeError):
        lb.samplers.register("not_a_sampler", dict)


def test_a_class_with_a_sample_method_is_a_sampler_without_subclassing(buf):
    """What the README promises: any class with ``sample(catalog, n, where, rng)`` registers and runs."""

    class LargestKeys:  # no lakebuffer base class
        def __init__(self, skip: int = 0):
            self.skip = skip

        def sample(self, catalog, n, where, rng):  # a plain list of keys is accepted too
            sql = f"SELECT key FROM meta WHERE {where or 'TRUE'} ORDER BY key DESC LIMIT {n} OFFSET {self.skip}"
            return catalog.query(sql).column("key").to_pylist()

    lb.samplers.register("largest_keys", LargestKeys)
    expected = [r["key"] for r in buf.sql("SELECT key FROM meta WHERE policy_version = 3 ORDER BY key DESC LIMIT 4").to_pylist()]
    assert keys_of(buf, 3, sampler="largest_keys", where="policy_version = 3") == expected[:3]
    assert keys_of(buf, 2, sampler="largest_keys", skip=2, where="policy_version = 3") == expected[2:4]
    assert keys_of(buf, 2, sampler=LargestKeys(skip=1), where="policy_version = 3") == expected[1:3]
    if isinstance(buf, lb.ReplayBuffer):  # return_info is the buffer's (TorchRL's) API
        rows, info = buf.sample(2, sampler=LargestKeys, where="policy_version = 3", columns=["key"], return_info=True)
        assert rows.column("key").to_pylist() == info["keys"].to_pylist() == expected[:2]
    with pytest.raises(lb.OptionError, match="no option 'skp'"):
        buf.sample(2, sampler="largest_keys", skp=1)

    class NoRng:
        def sample(self, catalog, n):
            return []

    for bad in (NoRng, dict):
        with pytest.raises(lb.SamplerError, match=r"catalog, n, where, rng\)"):
            lb.samplers.register("bad", bad)
    with pytest.raises(lb.SamplerError, match="sample"):
        buf.sample(2, sampler=NoRng())
    assert "bad" not in lb.samplers.names()


# --- uniform --------------------------------------------------------------------------------------
POOL = "episode_id IS NULL AND policy_version < 5"  # 30 groups x 8 = 240 rows


def test_uniform_without_replacement_is_uniform(buf):
    population = [r["key"] for r in table(buf, POOL)]
    assert len(population) == 240
    index = {k: i for i, k in enumerate(population)}
    counts = collections.Counter()
    pairs = np.zeros((240, 240))
    draws = 0
    for seed in range(240):
        got = keys_of(buf, 20, where=POOL, seed=seed)
        assert len(set(got)) == 20
        counts.update(got)
        idx = [index[k] for k in got]
        pairs[np.ix_(idx, idx)] += 1
        draws += 20
    stat = chi_square([counts[k] for k in population], [draws / 240] * 240)
    assert stat < CHI2_999[239], stat
    # samples are independent across seeds: pair co-occurrences are ~Poisson (variance/mean ~ 1);
    # ordering by DuckDB's hash(key, seed) (an XOR of a fixed hash with the seed's) gives ~80
    together = pairs[np.triu_indices(240, 1)]
    assert together.var() / together.mean() < 1.3


def test_uniform_with_replacement_is_uniform(buf):
    population = [r["key"] for r in table(buf, POOL)]
    got = keys_of(buf, 24_000, where=POOL, seed=3, replacement=True)
    counts = collections.Counter(got)
    assert len(got) == 24_000 and set(counts) <= set(population)
    stat = chi_square([counts[k] for k in population], [100] * 240)
    assert stat < CHI2_999[239], stat
    # not degenerate: about 240 * (1 - exp(-1)) distinct keys in a draw of 240
    distinct = len(set(keys_of(buf, 240, where=POOL, seed=4, replacement=True)))
    assert 130 < distinct < 175


@readers("local", "s3", why="it reads a ReplayBuffer's own sampling catalog")
def test_uniform_is_the_same_as_the_plain_top_n(buf):
    """The threshold scan is an optimisation only: the answer is the n smallest seeded hashes."""
    rng = np.random.default_rng(11)
    seed = Sampler.seed_from(np.random.default_rng(11))
    got = lb.samplers.get("uniform").sample(buf._catalog, 25, "reward > 0.3", rng).to_pylist()
    ref = buf.sql(f"SELECT key FROM meta WHERE reward > 0.3 ORDER BY hash(xor(hash(key), {seed}::UBIGINT)), key LIMIT 25")
    assert got == ref.column("key").to_pylist()


# --- prioritized time -------------------------------------------------------------------------------
GRPO = "episode_id IS NULL"  # 48 rows per policy version 0..9


def _version_counts(buf, keys) -> np.ndarray:
    version = {r["key"]: r["policy_version"] for r in table(buf, GRPO)}
    return np.bincount([version[k] for k in keys], minlength=10)


def test_prioritized_time_frequencies_follow_the_weights(buf):
    weights = 2.0 ** (np.arange(10) / 2.0)  # half_life = 2 versions
    share = weights / weights.sum()
    got = keys_of(buf, 20_000, where=GRPO, sampler="prioritized_time", half_life=2, replacement=True, seed=5)
    counts = _version_counts(buf, got)
    assert chi_square(counts, share * 20_000) < CHI2_999[9]
    # without replacement the first draw follows the weights exactly: n=1 over many seeds
    firsts = [keys_of(buf, 1, where=GRPO, sampler="prioritized_time", temperature=2 / np.log(2), seed=s)[0]
              for s in range(400)]
    assert chi_square(_version_counts(buf, firsts), share * 400) < CHI2_999[9]
    # a longer half-life is flatter: old rows are drawn more often
    flat = _version_counts(buf, keys_of(buf, 20_000, where=GRPO, sampler="prioritized_time", half_life=50,
                                        replacement=True, seed=5))
    assert flat[0] > 3 * counts[0] and flat.min() > 0.75 * flat.max()  # 2 ** (-9 / 50) = 0.88 expected


def test_prioritized_time_by_created_at_matches_policy_version(buf):
    # created_at = T0 + 60 s * version, so a 120 s half-life is a 2-version half-life
    a = keys_of(buf, 30, where=GRPO, sampler="prioritized_time", by="created_at", half_life=120, seed=9)
    b = keys_of(buf, 30, where=GRPO, sampler="prioritized_time", by="policy_version", half_life=2, seed=9)
    assert a == b and len(set(a)) == 30
    with pytest.raises(ValueError):
        lb.samplers.get("prioritized_time", half_life=1, temperature=1)


# --- freshness, reward, success blend ----------------------------------------------------------------
@pytest.mark.parametrize("current,max_lag", [(9, 0), (9, 2), (6, 1), (None, 3)])
def test_freshness_never_returns_a_row_past_max_lag(buf, current, max_lag):
    newest = 9 if current is None else current
    for seed in range(5):
        got = rows_of(buf, 30, sampler="freshness", max_lag=max_lag, current_version=current, seed=seed,
                      where="reward > 0.2")
        assert len(got) == 30
        assert all(newest - r["policy_version"] <= max_lag and r["reward"] > 0.2 for r in got)
    with pytest.raises(lb.NotEnoughRowsError):
        buf.sample(10, sampler="freshness", max_lag=0, current_version=100)


def test_freshness_composes_with_another_base_sampler(buf):
    got = rows_of(buf, 10, sampler="freshness", max_lag=1, base="group", where=GRPO)
    assert len(got) == 80 and {r["policy_version"] for r in got} <= {8, 9}


def test_reward_threshold_and_top_fraction(buf):
    got = rows_of(buf, 40, sampler="reward", min_reward=0.6, where=GRPO, seed=1)
    assert len(got) == 40 and all(r["reward"] >= np.float32(0.6) for r in got)
    rewards = np.array([r["reward"] for r in table(buf, GRPO)], dtype=np.float32)
    cut = np.sort(rewards)[int(np.ceil(0.9 * len(rewards))) - 1]  # quantile_disc(0.9)
    top = rows_of(buf, 40, sampler="reward", top_fraction=0.1, where=GRPO, seed=2)
    assert len(top) == 40 and all(r["reward"] >= cut for r in top)
    with pytest.raises(lb.NotEnoughRowsError):  # about 48 rows are in the top 10%
        buf.sample(60, sampler="reward", top_fraction=0.1, where=GRPO)
    lo = np.sort(rewards)[int(np.ceil(0.1 * len(rewards))) - 1]
    both = rows_of(buf, 80, sampler="reward", top_fraction=0.1, bottom_fraction=0.1, where=GRPO, seed=3)
    assert all(r["reward"] >= cut or r["reward"] <= lo for r in both)
    assert any(r["reward"] <= lo for r in both) and any(r["reward"] >= cut for r in both)


def test_success_blend_fraction_is_exact(buf):
    opts = dict(sampler="success_blend", success_fraction=0.25, success_where="verified",
                fresh_where="policy_version >= 7 AND NOT verified", where=GRPO)
    shares = []
    for seed in range(10):
        got = rows_of(buf, 40, seed=seed, **opts)
        assert len(got) == 40 and len({r["key"] for r in got}) == 40
        n_success = sum(r["verified"] for r in got)
        assert n_success == 10 and all(r["verified"] or r["policy_version"] >= 7 for r in got)
        shares.append([r["verified"] for r in got[:20]].count(True) / 20)
    assert 0.1 < np.mean(shares) < 0.4  # successes are shuffled into the batch, not all first


def test_success_blend_defaults_mix_history_and_fresh(buf):
    got = rows_of(buf, 20, sampler="success_blend", success_fraction=0.5, threshold=0.95, max_lag=1,
                  where=GRPO, seed=2)
    success = [r for r in got if r["verified"] or r["reward"] >= np.float32(0.95)]
    assert len(got) == 20 and len({r["key"] for r in got}) == 20
    assert len(success) >= 10
    assert all(r["policy_version"] >= 8 for r in got if r not in success)
    assert any(r["policy_version"] < 8 for r in success)  # history, not only fresh successes


# --- group, episode, segment, team -----------------------------------------------------------------
def _runs(rows, field):
    """Split rows into maximal runs of equal ``field``; each value must form exactly one run."""
    runs: list[list[dict]] = []
    for r in rows:
        if not runs or runs[-1][0][field] != r[field]:
            runs.append([])
        runs[-1].append(r)
    assert len({run[0][field] for run in runs}) == len(runs), f"{field} is not contiguous"
    return runs


def test_group_returns_complete_groups_only(buf):
    by_group = collections.Counter(r["group_id"] for r in table(buf))
    for seed in range(5):
        got = rows_of(buf, 6, sampler="group", where=GRPO, seed=seed)
        runs = _runs(got, "group_id")
        assert len(runs) == 6
        assert all(len(run) == by_group[run[0]["group_id"]] == 8 for run in runs)
        assert all(run == sorted(run, key=lambda r: r["key"]) for run in runs)


def test_group_match_all_any_and_rows_unit(buf):
    rows = table(buf, GRPO)
    low = {r["group_id"] for r in rows if r["reward"] <= 0.15}
    all_ok = rows_of(buf, 10, sampler="group", where=f"{GRPO} AND reward > 0.15", seed=1)
    assert len(all_ok) == 80 and not {r["group_id"] for r in all_ok} & low
    anyg = rows_of(buf, 40, sampler="group", match="any", where=f"{GRPO} AND reward > 0.15", seed=1)
    assert len(anyg) == 320 and {r["group_id"] for r in anyg} & low  # whole groups, failing rows included
    by_rows = rows_of(buf, 20, sampler="group", unit="rows", where=GRPO, seed=2)
    assert 20 <= len(by_rows) < 28 and all(len(run) == 8 for run in _runs(by_rows, "group_id"))
    with pytest.raises(lb.NotEnoughRowsError):
        buf.sample(61, sampler="group", where=GRPO)
    assert len(keys_of(buf, 61, sampler="group", where=GRPO, allow_fewer=True)) == 480


def test_groups_are_uniform_over_groups(buf):
    counts = collections.Counter()
    for seed in range(100):
        counts.update(r["group_id"] for r in rows_of(buf, 6, sampler="group", where=GRPO, seed=seed)[::8])
    assert len(counts) == 60 and max(counts.values()) < 25 and min(counts.values()) > 2


def test_episode_rows_are_whole_contiguous_and_in_step_order(buf):
    lengths = collections.Counter(r["episode_id"] for r in table(buf, "episode_id LIKE 'e%'"))
    for seed in range(5):
        got = rows_of(buf, 4, sampler="episode", where="episode_id LIKE 'e%'", seed=seed)
        runs = _runs(got, "episode_id")
        assert len(runs) == 4
        for run in runs:
            steps = [r["step"] for r in run]
            assert steps == sorted(steps) and len(run) == lengths[run[0]["episode_id"]]
    ma = rows_of(buf, 2, sampler="episode", where="team_id IS NOT NULL", seed=1)
    for run in _runs(ma, "episode_id"):
        order = [(r["step"], r["team_id"], r["agent_id"]) for r in run]
        assert order == sorted(order) and len(run) in (35, 36)


def test_segments_are_consecutive_steps_of_one_track(buf):
    for seed in range(5):
        got = rows_of(buf, 8, sampler="segment", length=4, where="step != 6", seed=seed)
        assert len(got) == 32
        for i in range(0, 32, 4):
            seg = got[i:i + 4]
            assert len({(r["episode_id"], r["agent_id"]) for r in seg}) == 1
            assert [r["step"] for r in seg] == list(range(seg[0]["step"], seg[0]["step"] + 4))
            assert all(r["step"] != 6 for r in seg)
    # episodes e0, e4, ... have no step 3: no segment of theirs may cover it
    gapped = rows_of(buf, 5, sampler="segment", length=3, where="episode_id IN ('e0', 'e4', 'e8', 'e12')")
    assert all(3 not in range(gapped[i]["step"], gapped[i]["step"] + 3) for i in range(0, 15, 3))
    strided = rows_of(buf, 6, sampler="segment", length=2, stride=2, where="team_id IS NULL", seed=3)
    assert all(strided[i]["step"] % 2 == 0 for i in range(0, 12, 2))
    with pytest.raises(lb.NotEnoughRowsError):
        buf.sample(1, sampler="segment", length=16)


def test_team_rows_are_aligned_by_step(buf):
    agents = collections.defaultdict(set)
    for r in table(buf, "team_id IS NOT NULL"):
        agents[(r["episode_id"], r["team_id"])].add(r["agent_id"])
    for seed in range(4):
        got = rows_of(buf, 5, sampler="team", seed=seed)
        runs = _runs([dict(r, team=(r["episode_id"], r["team_id"])) for r in got], "team")
        assert len(runs) == 5
        for run in runs:
            team = run[0]["team"]
            order = [(r["step"], r["agent_id"]) for r in run]
            assert order == sorted(order)
            by_step = collections.defaultdict(list)
            for r in run:
                by_step[r["step"]].append(r["agent_id"])
            assert all(sorted(a) == sorted(agents[team]) for a in by_step.values())
            incomplete = team[1] == "t0" and int(team[0][1:]) % 3 == 0
            assert sorted(by_step) == ([0, 1, 3, 4, 5] if incomplete else list(range(6)))
    filtered = rows_of(buf, 3, sampler="team", where="step >= 4", seed=1)
    assert all(r["step"] >= 4 for r in filtered) and len(filtered) == 3 * 2 * 3
    with pytest.raises(lb.NotEnoughRowsError):
        buf.sample(21, sampler="team")
    assert len(keys_of(buf, 1, sampler="team", min_steps=6, where="episode_id = 'm0'")) == 18  # only t1
    with pytest.raises(lb.NotEnoughRowsError):
        buf.sample(2, sampler="team", min_steps=6, where="episode_id = 'm0'")


# --- max reuse -------------------------------------------------------------------------------------
def test_max_reuse_never_exceeds_k_across_restarts(tmp_path):
    small = WORLD.filter(pa.compute.is_null(WORLD.column("episode_id"))).slice(0, 40)
    seen = collections.Counter()
    b = _open(tmp_path)
    _fill(b, small, batch=8)
    try:
        for call in range(20):
            if call % 3 == 2:  # restart: counts must survive in the index
                b.close()
                b = _open(tmp_path)
            got = keys_of(b, 10, sampler="max_reuse", k=2, seed=call, allow_fewer=True)
            assert len(set(got)) == len(got)
            seen.update(got)
            assert max(seen.values()) <= 2
            if not got:
                break
        assert sum(seen.values()) == 80 and set(seen.values()) == {2}  # used up, each exactly twice
        with pytest.raises(lb.NotEnoughRowsError):
            b.sample(1, sampler="max_reuse", k=2)
        b.close()
        b = _open(tmp_path)
        counts = b.get(list(seen), ["sample_count"]).column(0).to_pylist()
        assert counts == [2] * 40
        assert len(keys_of(b, 5, sampler="max_reuse", k=3)) == 5
    finally:
        b.close()


def test_max_reuse_with_a_payload_predicate_reads_live_counts(tmp_path):
    small = WORLD.filter(pa.compute.is_null(WORLD.column("episode_id"))).slice(0, 16)
    with _open(tmp_path) as b:
        _fill(b, small, batch=8)
        first = keys_of(b, 10, sampler="max_reuse", k=1, where="len(response_ids) = 4")
        second = keys_of(b, 6, sampler="max_reuse", k=1, where="len(response_ids) = 4", seed=1)
        assert not set(first) & set(second)
        with pytest.raises(lb.NotEnoughRowsError):
            b.sample(1, sampler="max_reuse", k=1, where="len(response_ids) = 4")


# --- priority --------------------------------------------------------------------------------------
def test_priority_frequencies_follow_priority_to_the_alpha(buf):
    pri = dict(sampler="priority", priority="policy_version", where=GRPO)
    got = keys_of(buf, 18_000, alpha=1.0, replacement=True, seed=8, **pri)
    counts = _version_counts(buf, got)
    assert counts[0] == 0  # priority 0: never
    share = np.arange(1, 10) / np.arange(1, 10).sum()
    assert chi_square(counts[1:], share * 18_000) < CHI2_999[9] - 1  # df = 8, tighter than 9's
    squared = _version_counts(buf, keys_of(buf, 18_000, alpha=2.0, replacement=True, seed=8, **pri))
    assert squared[9] / squared[1] > 40  # 81 expected
    eps = _version_counts(buf, keys_of(buf, 2_000, alpha=1.0, eps=1.0, replacement=True, seed=8, **pri))
    assert eps[0] > 0
    distinct = keys_of(buf, 400, **pri)
    assert len(set(distinct)) == 400
    with pytest.raises(lb.NotEnoughRowsError):  # only 432 rows have a positive priority
        buf.sample(433, **pri)
    default = rows_of(buf, 30, sampler="priority", where=GRPO, seed=2)  # abs(advantage)
    assert np.mean([abs(r["advantage"]) for r in default]) > np.mean([abs(r["advantage"]) for r in table(buf, GRPO)])


# --- determinism, predicates, errors ------------------------------------------------------------------
CASES = {
    "uniform": dict(n=20),
    "uniform_replacement": dict(n=20, sampler="uniform", replacement=True),
    "prioritized_time": dict(n=20, half_life=2),
    "prioritized_time_replacement": dict(n=20, sampler="prioritized_time", replacement=True),
    "freshness": dict(n=20, max_lag=3),
    "reward": dict(n=20, top_fraction=0.5),
    "success_blend": dict(n=20, success_fraction=0.3, max_lag=4, threshold=0.9),
    "group": dict(n=4),
    "episode": dict(n=3),
    "segment": dict(n=4, length=3),
    "team": dict(n=3),
    "max_reuse": dict(n=20, k=1_000_000),
    "priority": dict(n=20, priority="reward"),
    "priority_replacement": dict(n=20, sampler="priority", priority="reward", replacement=True),
}


def _case(name):
    opts = dict(CASES[name])
    opts.setdefault("sampler", name)
    return opts.pop("n"), opts


@pytest.mark.parametrize("name", sorted(CASES))
def test_determinism(buf, name):
    n, opts = _case(name)
    a = keys_of(buf, n, seed=1, **opts)
    assert a == keys_of(buf, n, seed=1, **opts)
    assert a != keys_of(buf, n, seed=2, **opts)
    assert len(a) >= n


def test_same_seed_same_keys_after_a_restart(tmp_path):
    b = _open(tmp_path)
    _fill(b)
    try:
        before = {name: keys_of(b, _case(name)[0], seed=7, **_case(name)[1]) for name in CASES if name != "max_reuse"}
        b.close()
        b = _open(tmp_path)
        for name, keys in before.items():
            assert keys_of(b, _case(name)[0], seed=7, **_case(name)[1]) == keys, name
    finally:
        b.close()


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_sampler_respects_where(buf, name):
    n, opts = _case(name)
    # whole episodes / teams must match in every row: a looser reward bound keeps enough of them
    low = 0.05 if name in ("episode", "team", "segment") else 0.3
    opts["where"] = f"reward > {low} AND policy_version >= 2"
    got = rows_of(buf, n, seed=3, **opts)
    assert len(got) >= n and all(r["reward"] > low and r["policy_version"] >= 2 for r in got)


@pytest.mark.parametrize("name", ["uniform", "prioritized_time", "group", "segment", "team", "priority"])
def test_payload_predicates_work(buf, name):
    n, opts = _case(name)
    got = keys_of(buf, n, where="len(response_ids) = 4 AND reward < 2", seed=1, **opts)
    assert len(got) >= n


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_where_raises_query_error(buf, name):
    n, opts = _case(name)
    with pytest.raises(lb.QueryError):
        buf.sample(n, where="no_such_column > 1", **opts)
    with pytest.raises(lb.QueryError):
        buf.sample(n, where="reward > 0; DROP TABLE meta", **opts)


def test_not_enough_rows(buf):
    with pytest.raises(lb.NotEnoughRowsError):
        buf.sample(241, where=POOL)
    assert len(keys_of(buf, 241, where=POOL, allow_fewer=True)) == 240
    assert len(keys_of(buf, 500, where=POOL, replacement=True)) == 500
    with pytest.raises(lb.NotEnoughRowsError):
        buf.sample(1, where="reward > 5", replacement=True)
    with pytest.raises(lb.NotEnoughRowsError):
        buf.sample(1, sampler="prioritized_time", where="reward > 5")
    with pytest.raises(lb.NotEnoughRowsError):
        buf.sample(3, sampler="episode", where="episode_id IN ('e1', 'e2')")
    assert keys_of(buf, 0, where=POOL) == []
    with pytest.raises(ValueError):
        buf.sample(-1)


def test_return_keys_then_get(buf):
    keys = buf.sample(8, sampler="episode", where="episode_id = 'e5'", unit="rows", return_keys=True)
    assert isinstance(keys, pa.Array) and pa.types.is_string(keys.type)
    steps = buf.get(keys, ["step"]).column(0).to_pylist()
    assert steps == list(range(10))
