"""Builds notebooks/cross_run_reuse.ipynb from the cells below (keeps the notebook reviewable as code)."""

from pathlib import Path

import nbformat as nbf

cells = [
    ("md", """# Cross-run rollout reuse

Which rollouts did each run generate, how good and how stale were they, and which prompts one run solved
that another could replay? Everything below is DuckDB SQL over the lake (`sql/analysis/*.sql`, also runnable
with `lakebuffer sql LAKE --file sql/analysis/<name>.sql`) and polars for the frames, matplotlib for plots."""),
    ("code", """# Parameters: point LAKE at an existing lake (any fsspec URL); None builds a small 3-run lake here.
LAKE = None
STORAGE_OPTIONS = None"""),
    ("code", """import tempfile
import numpy as np
import polars as pl
import pyarrow as pa
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
import lakebuffer as lb
from lakebuffer.resources import sql_text

def synthetic_run(root, lake, run_id, versions, solve_rate, seed):
    # push a few policy versions of GRPO groups, replay some, snapshot to the lake
    rng = np.random.default_rng(seed)
    with lb.ReplayBuffer.open(f"{root}/{run_id}", lake=lake, run_id=run_id, memory_limit_mb=8,
                              snapshot_interval_s=0) as buf:
        for v in range(versions):
            n, L = 256, 48
            lens = rng.integers(8, L, n)
            off = np.zeros(n + 1, dtype=np.int32); np.cumsum(lens, out=off[1:])
            toks = pa.ListArray.from_arrays(pa.array(off), pa.array(rng.integers(0, 32000, off[-1], dtype=np.int32)))
            reward = rng.random(n).astype(np.float32) * (0.6 + solve_rate * v / versions)
            buf.push({"prompt_id": [f"p{(i // 8) % 40}" for i in range(n)], "policy_version": np.full(n, v),
                      "prompt_ids": toks, "response_ids": toks, "reward": reward,
                      "verified": reward > 0.85})
            top = v
            buf.sample(64, where=f"policy_version >= {max(0, top - 2)}", seed=v)
        buf.flush()
        buf.snapshot(wait=True)

if LAKE is None:
    root = tempfile.mkdtemp(prefix="lakebuffer-nb-")
    LAKE = f"{root}/lake"
    for i, (run, versions, rate) in enumerate([("run-a", 6, 0.2), ("run-b", 8, 0.5), ("run-c", 4, 0.05)]):
        synthetic_run(root, LAKE, run, versions, rate, seed=i)

view = lb.ReplayBuffer.open_lake(LAKE, storage_options=STORAGE_OPTIONS)
def q(name):
    return pl.from_arrow(view.sql(sql_text(f"analysis/{name}")))
print(view.runs, len(view), "rollouts")"""),
    ("md", "## Rollouts per run and policy version"),
    ("code", """per_version = q("rollouts_per_run_version")
assert per_version["rollouts"].sum() == len(view)
per_version"""),
    ("md", "## Reward distribution by policy version"),
    ("code", """rewards = q("reward_by_version")
fig, ax = plt.subplots(figsize=(7, 3.5))
for run, frame in rewards.group_by("run_id", maintain_order=True):
    ax.plot(frame["policy_version"], frame["mean_reward"], marker="o", label=run[0])
    ax.fill_between(frame["policy_version"].to_numpy(), frame["q25"].to_numpy(), frame["q75"].to_numpy(), alpha=0.15)
ax.set_xlabel("policy version"); ax.set_ylabel("reward (mean, IQR)"); ax.legend(); fig.tight_layout()
rewards"""),
    ("md", "## How stale was replayed data? (policy lag, weighted by replays)"),
    ("code", """lag = q("policy_lag")
fig, ax = plt.subplots(figsize=(7, 3.5))
runs = lag["run_id"].unique(maintain_order=True).to_list()
for i, run in enumerate(runs):
    frame = lag.filter(pl.col("run_id") == run)
    ax.bar(frame["lag"].to_numpy() + i / (len(runs) + 1), frame["samples"].to_numpy(), width=1 / (len(runs) + 1), label=run)
ax.set_xlabel("policy lag (versions behind the run's newest)"); ax.set_ylabel("replays"); ax.legend(); fig.tight_layout()
assert lag["samples"].sum() > 0
lag"""),
    ("md", "## Success-replay candidates: solved in one run, unsolved in another"),
    ("code", """cands = q("success_candidates")
print(len(cands), "prompt/run pairs could be seeded with another run's verified responses")
cands.head(10)"""),
    ("md", "## Token counts"),
    ("code", """tokens = q("token_counts")
assert (tokens["response_tokens"] > 0).all()
tokens"""),
    ("md", "## Reuse counts (how often rollouts were replayed before the snapshot)"),
    ("code", """reuse = q("reuse_counts")
fig, ax = plt.subplots(figsize=(7, 3))
pivot = reuse.pivot(on="run_id", index="sample_count", values="rollouts").fill_null(0).sort("sample_count")
for run in [c for c in pivot.columns if c != "sample_count"]:
    ax.plot(pivot["sample_count"], pivot[run], marker="o", label=run)
ax.set_yscale("log"); ax.set_xlabel("times replayed"); ax.set_ylabel("rollouts"); ax.legend(); fig.tight_layout()
reuse"""),
    ("md", "## Seed a new run with another run's verified history"),
    ("code", """seed_batch = view.sample(32, where="run_id <> 'run-c' AND verified", columns=["key", "run_id", "prompt_id", "reward"], seed=0)
assert all(seed_batch.column("reward").to_pylist()) and "run-c" not in seed_batch.column("run_id").to_pylist()
pl.from_arrow(seed_batch).head()"""),
]

nb = nbf.v4.new_notebook()
nb.cells = [nbf.v4.new_markdown_cell(src) if kind == "md" else nbf.v4.new_code_cell(src) for kind, src in cells]
nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
Path(__file__).with_name("cross_run_reuse.ipynb").write_text(nbf.writes(nb))
