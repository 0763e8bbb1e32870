"""Builds notebooks/cross_run_reuse.ipynb from the cells below (keeps the notebook reviewable as code)."""

from pathlib import Path

import nbformat as nbf

cells = [
    ("md", """# Cross-run rollout reuse

Which rollouts did each run generate, how good and how stale were they, and which prompts one run solved
that another could replay? Everything below is DuckDB SQL over the lake (`sql/analysis/*.sql`, also runnable
with `lakebuffer sql LAKE --query <name>`) and polars for the frames, matplotlib for plots.

Policy lag is measured **at replay**: every `sample()` records which policy version replayed each rollout
(`buf.set_policy_version(v)` before sampling) in the run directory's `replays` table."""),
    ("code", """# Parameters: point LAKE at an existing lake (any fsspec URL) and RUN_DIRS at the runs' buffer directories
# (run_id -> path; replay events live there). LAKE = None builds a small 3-run lake here.
LAKE = None
RUN_DIRS = {}
STORAGE_OPTIONS = None"""),
    ("code", """import tempfile
import numpy as np
import polars as pl
import pyarrow as pa
%matplotlib inline
import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator
import lakebuffer as lb
from lakebuffer.resources import sql_text

def synthetic_run(root, lake, run_id, versions, solve_rate, seed):
    # push a few policy versions of GRPO groups (8 per prompt), replay recent ones, snapshot to the lake
    rng = np.random.default_rng(seed)
    difficulty = rng.random(40)
    with lb.ReplayBuffer.open(f"{root}/{run_id}", lake=lake, run_id=run_id, memory_limit_mb=8,
                              snapshot_interval_s=0) as buf:
        for v in range(versions):
            n, L = 256, 48
            lens = np.minimum(rng.integers(8, L + 12, n), L)  # some hit the generation cap L
            off = np.zeros(n + 1, dtype=np.int32); np.cumsum(lens, out=off[1:])
            toks = pa.ListArray.from_arrays(pa.array(off), pa.array(rng.integers(0, 32000, off[-1], dtype=np.int32)))
            prompt = (np.arange(n) // 8) % 40
            p_solve = np.clip(1.2 - difficulty[prompt] + solve_rate * v / versions - 0.5, 0, 1)
            solved = rng.random(n) < p_solve
            reward = np.where(solved, 1.0, 0.0).astype(np.float32)
            buf.push({"prompt_id": [f"p{i}" for i in prompt], "group_id": [f"{run_id}-v{v}-g{i // 8}" for i in range(n)],
                      "policy_version": np.full(n, v), "prompt_ids": toks, "response_ids": toks, "reward": reward,
                      "verified": solved})
            buf.set_policy_version(v, step=v)  # the trainer now replays with policy v
            buf.sample(64, where=f"policy_version >= {max(0, v - 2)}", seed=v)
        buf.flush()
        buf.snapshot(wait=True)

if LAKE is None:
    root = tempfile.mkdtemp(prefix="lakebuffer-nb-")
    LAKE = f"{root}/lake"
    for i, (run, versions, rate) in enumerate([("run-a", 6, 0.2), ("run-b", 8, 0.5), ("run-c", 4, 0.05)]):
        synthetic_run(root, LAKE, run, versions, rate, seed=i)
        RUN_DIRS[run] = f"{root}/{run}"

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
    ("md", """## How stale was replayed data? (policy lag at replay)
Lag = the policy version that replayed a rollout minus the version that generated it, one count per replay
event (`sql/analysis/policy_lag_at_replay.sql` over each run directory's `replays` table)."""),
    ("code", """def run_query(run_dir, name):
    with lb.ReplayBuffer.open(run_dir, lake=LAKE, storage_options=STORAGE_OPTIONS, snapshot_interval_s=0) as buf:
        return pl.from_arrow(buf.sql(sql_text(f"analysis/{name}")))

lag = pl.concat([run_query(d, "policy_lag_at_replay") for d in RUN_DIRS.values()])
fig, ax = plt.subplots(figsize=(7, 3.5))
runs = lag["run_id"].unique(maintain_order=True).to_list()
for i, run in enumerate(runs):
    frame = lag.filter(pl.col("run_id") == run)
    ax.bar(frame["lag"].to_numpy() + i / (len(runs) + 1), frame["replays"].to_numpy(), width=1 / (len(runs) + 1), label=run)
ax.xaxis.set_major_locator(MaxNLocator(integer=True))
ax.set_xlabel("policy lag at replay (replaying version - rollout version)"); ax.set_ylabel("replays"); ax.legend(); fig.tight_layout()
assert lag["replays"].sum() > 0 and lag["lag"].max() <= 2  # the synthetic runs replay versions >= current - 2
lag"""),
    ("md", "## Zero-variance GRPO groups (all rewards equal: zero advantage, no learning signal)"),
    ("code", """zv = q("zero_variance_groups")
fig, ax = plt.subplots(figsize=(7, 3))
for run, frame in zv.group_by("run_id", maintain_order=True):
    ax.plot(frame["policy_version"], frame["zero_variance_share"], marker="o", label=run[0])
ax.xaxis.set_major_locator(MaxNLocator(integer=True)); ax.set_ylim(0, 1)
ax.set_xlabel("policy version"); ax.set_ylabel("share of groups"); ax.legend(); fig.tight_layout()
zv"""),
    ("md", "## Truncation rate (responses at the generation cap)"),
    ("code", """trunc = q("truncation_rate")
fig, ax = plt.subplots(figsize=(7, 3))
for run, frame in trunc.group_by("run_id", maintain_order=True):
    ax.plot(frame["policy_version"], frame["truncation_rate"], marker="o", label=run[0])
ax.xaxis.set_major_locator(MaxNLocator(integer=True))
ax.set_xlabel("policy version"); ax.set_ylabel("truncated share"); ax.legend(); fig.tight_layout()
trunc"""),
    ("md", "## Response length vs reward"),
    ("code", """lvr = q("length_vs_reward")
fig, ax = plt.subplots(figsize=(7, 3))
for run, frame in lvr.group_by("run_id", maintain_order=True):
    ax.scatter(frame["length_bucket"], frame["mean_reward"], s=4 + frame["rollouts"].to_numpy() / 4, alpha=0.7, label=run[0])
ax.set_xlabel("response length (tokens, 8-token buckets)"); ax.set_ylabel("mean reward"); ax.legend(); fig.tight_layout()
lvr"""),
    ("md", "## Per-prompt pass rate over policy versions"),
    ("code", """passes = q("pass_rate_by_prompt")
runs = passes["run_id"].unique(maintain_order=True).to_list()
fig, axes = plt.subplots(1, len(runs), figsize=(4 * len(runs), 4), squeeze=False)
for ax, run in zip(axes[0], runs):
    grid = (passes.filter(pl.col("run_id") == run)
            .pivot(on="policy_version", index="prompt_id", values="pass_rate").sort("prompt_id"))
    cols = sorted((c for c in grid.columns if c != "prompt_id"), key=int)
    im = ax.imshow(grid.select(cols).to_numpy(), aspect="auto", vmin=0, vmax=1, cmap="viridis")
    ax.set_xticks(range(len(cols)), cols); ax.set_title(run); ax.set_xlabel("policy version")
    ax.set_ylabel("prompt")
fig.colorbar(im, ax=axes[0].tolist(), label="pass rate")
passes.head()"""),
    ("md", "## Success-replay candidates: solved in one run, unsolved in another"),
    ("code", """cands = q("success_candidates")
print(len(cands), "prompt/run pairs could be seeded with another run's verified responses")
cands.head(10)"""),
    ("md", "## Token counts"),
    ("code", """tokens = q("token_counts")
assert (tokens["response_tokens"] > 0).all()
tokens"""),
    ("md", "## Reuse per rollout (how often rollouts were replayed before the snapshot)"),
    ("code", """reuse = q("reuse_counts")
fig, ax = plt.subplots(figsize=(7, 3))
# one series per run, only the counts that occur: no zeros to draw on a log scale
for run, frame in reuse.group_by("run_id", maintain_order=True):
    ax.plot(frame["sample_count"], frame["rollouts"], marker="o", label=run[0])
ax.set_yscale("log"); ax.xaxis.set_major_locator(MaxNLocator(integer=True))
ax.set_xlabel("times replayed"); ax.set_ylabel("rollouts"); ax.legend(); fig.tight_layout()
assert reuse["rollouts"].dtype == pl.Int64 and (reuse["rollouts"] > 0).all()
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
