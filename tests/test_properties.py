"""Property-based tests: random push/delete/sample/close/open sequences against a simple model."""

from __future__ import annotations

import shutil
import tempfile

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import lakebuffer as lb
from tests.rollouts import make_rollouts


class BufferModel(RuleBasedStateMachine):
    """The model: a dict key -> (reward, policy_version) of every acknowledged, undeleted row."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="lb-prop-")
        self.durability = "wal"
        self.buf = self._open()
        self.model: dict[str, tuple[float, int]] = {}
        self.counter = 0

    def _open(self):
        return lb.ReplayBuffer.open(self.dir, memory_limit_mb=0.25, snapshot_interval_s=0, durability=self.durability)

    @rule(n=st.integers(1, 40), tokens=st.sampled_from([4, 64, 512]), version=st.integers(0, 5))
    def push(self, n, tokens, version):
        self.counter += 1
        t = make_rollouts(n, tokens=tokens, version=version, seed=self.counter)
        keys = self.buf.push(t).to_pylist()
        assert len(keys) == n
        for k, r in zip(keys, t.column("reward").to_pylist()):
            assert k not in self.model
            self.model[k] = (r, version)

    @precondition(lambda self: self.model)
    @rule(frac=st.floats(0.0, 1.0), data=st.data())
    def delete_keys(self, frac, data):
        keys = sorted(self.model)
        chosen = data.draw(st.lists(st.sampled_from(keys), max_size=max(1, int(len(keys) * frac)), unique=True))
        assert self.buf.delete(keys=chosen + ["never-pushed"]) == len(chosen)
        for k in chosen:
            del self.model[k]

    @rule(version=st.integers(0, 5))
    def delete_where(self, version):
        gone = [k for k, (_, v) in self.model.items() if v == version]
        assert self.buf.delete(where=f"policy_version = {version}") == len(gone)
        for k in gone:
            del self.model[k]

    @rule(n=st.integers(1, 30), threshold=st.floats(0.0, 1.0), seed=st.integers(0, 5))
    def sample(self, n, threshold, seed):
        matching = {k for k, (r, _) in self.model.items() if r > threshold}
        where = f"reward > {threshold!r}"
        if len(matching) < n:
            try:
                self.buf.sample(n, where=where, seed=seed)
            except lb.NotEnoughRowsError:
                return
            raise AssertionError("sampling more rows than match must raise NotEnoughRowsError")
        t = self.buf.sample(n, where=where, seed=seed, columns=["key", "reward"])
        keys = t.column("key").to_pylist()
        assert len(set(keys)) == n and set(keys) <= matching
        assert t.column("reward").to_pylist() == [self.model[k][0] for k in keys]

    @rule(durability=st.sampled_from(["wal", "memory"]))
    def reopen(self, durability):
        self.buf.close()
        self.durability = durability
        self.buf = self._open()

    @invariant()
    def agrees_with_model(self):
        stored = self.buf.sql("SELECT key, reward FROM rollouts").to_pylist()
        assert {r["key"]: r["reward"] for r in stored} == {k: v[0] for k, v in self.model.items()}
        assert len(stored) == len(self.model)
        st_ = self.buf.stats()
        assert st_["hot"]["bytes"] <= st_["hot"]["limit_bytes"]

    def teardown(self):
        self.buf.close()
        shutil.rmtree(self.dir, ignore_errors=True)


TestBufferModel = BufferModel.TestCase
TestBufferModel.settings = settings(
    max_examples=12, stateful_step_count=12, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
