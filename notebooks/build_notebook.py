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
# (run_id -> path; replay events live there): any subset of the lake's runs, or none ({}). LAKE = None builds
# a small 3-run lake here, with its run directories.
LAKE = None
RUN_DIRS = {}
STORAGE_OPTIONS = None
MAX_OVERLAY = 4    # up to this many runs share one plot; more get one small panel each (same axes)
MAX_COLUMNS = 30   # the pass-rate heatmap merges policy versions into at most this many columns
TOP_PROMPTS = 40   # ... and shows the prompts with the most attempts"""),
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

SYNTHETIC = LAKE is None
if SYNTHETIC:
    root = tempfile.mkdtemp(prefix="lakebuffer-nb-")
    LAKE = f"{root}/lake"
    for i, (run, versions, rate) in enumerate([("run-a", 6, 0.2), ("run-b", 8, 0.5), ("run-c", 4, 0.05)]):
        synthetic_run(root, LAKE, run, versions, rate, seed=i)
        RUN_DIRS[run] = f"{root}/{run}"

view = lb.ReplayBuffer.open_lake(LAKE, storage_options=STORAGE_OPTIONS)
if not len(view):
    raise ValueError(f"{LAKE} holds no snapshotted rollouts: point LAKE at a lake runs have snapshotted to "
                     "(buf.snapshot(wait=True) or the periodic snapshot), or LAKE = None for the demo lake")
def q(name):
    return pl.from_arrow(view.sql(sql_text(f"analysis/{name}")))
print(view.runs, len(view), "rollouts")

# Plots: one shared axes for a few runs, small multiples (same axes) for many; every figure titled, every
# axis labelled with its unit in brackets; markers only while the points are few enough to tell apart.
def runs_of(frame):
    return frame["run_id"].unique(maintain_order=True).to_list()

def run_panels(runs, title, xlabel, ylabel, height=3.2):
    runs = list(runs)
    if len(runs) <= MAX_OVERLAY:
        fig, ax = plt.subplots(figsize=(7, height), layout="constrained")
        ax.set_title(title); ax.set_xlabel(xlabel); ax.set_ylabel(ylabel)
        return fig, [(run, ax) for run in runs]
    ncols = min(4, len(runs)); nrows = -(-len(runs) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.2 * ncols, 2.2 * nrows + 0.9), sharex=True, sharey=True,
                             squeeze=False, layout="constrained")
    fig.suptitle(title); fig.supxlabel(xlabel); fig.supylabel(ylabel)
    for ax, run in zip(axes.flat, runs):
        ax.set_title(run, fontsize=9)
    for ax in axes.flat[len(runs):]:
        ax.set_visible(False)
    return fig, list(zip(runs, axes.flat))

def legend(panels):
    if len({id(ax) for _, ax in panels}) == 1 and len(panels) > 1:
        panels[0][1].legend(title="run", fontsize=8)

def style(n_points):
    return {"marker": "o", "markersize": 4} if n_points <= 20 else {}"""),
    ("md", "## Rollouts per run and policy version"),
    ("code", """per_version = q("rollouts_per_run_version")
assert per_version["rollouts"].sum() == len(view)
per_version.group_by("run_id", maintain_order=True).agg(
    versions=pl.col("policy_version").n_unique(), first_version=pl.col("policy_version").min(),
    last_version=pl.col("policy_version").max(), rollouts=pl.col("rollouts").sum(),
    response_tokens=pl.col("response_tokens").sum())"""),
    ("md", "## Reward distribution by policy version"),
    ("code", """rewards = q("reward_by_version")
fig, panels = run_panels(runs_of(rewards), "Reward by policy version (line: mean; band: 25th-75th percentile)",
                         "policy version (update #)", "reward (score as pushed)")
for run, ax in panels:
    frame = rewards.filter(pl.col("run_id") == run)
    ax.plot(frame["policy_version"], frame["mean_reward"], label=run, **style(len(frame)))
    ax.fill_between(frame["policy_version"].to_numpy(), frame["q25"].to_numpy(), frame["q75"].to_numpy(), alpha=0.15)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
legend(panels)
rewards"""),
    ("md", """## How stale was replayed data? (policy lag at replay)
Lag = the policy version that replayed a rollout minus the version that generated it, one count per replay
event (`sql/analysis/policy_lag_at_replay.sql` over each run directory's `replays` table). Without run
directories (`RUN_DIRS = {}`) the plot falls back to the lake's version gap (`policy_lag.sql`: each run's
newest version minus a rollout's, weighted by its replays as snapshotted)."""),
    ("code", """def run_query(run_dir, name):
    with lb.ReplayBuffer.open(run_dir, lake=LAKE, storage_options=STORAGE_OPTIONS, snapshot_interval_s=0) as buf:
        return pl.from_arrow(buf.sql(sql_text(f"analysis/{name}")))

frames = [run_query(d, "policy_lag_at_replay") for d in RUN_DIRS.values()]
if frames:
    lag = pl.concat(frames)
    title, xlabel = "Policy lag at replay (RUN_DIRS' replay events)", "policy lag at replay (versions: replaying - generating)"
else:
    print("RUN_DIRS is empty: replay events live in the run directories; showing the lake's version gap instead")
    lag = q("policy_lag").select("run_id", "lag", pl.col("samples").alias("replays"))
    title, xlabel = "Version gap to each run's newest policy (lake; no RUN_DIRS)", "version gap (versions: newest - generating)"
fig, panels = run_panels(runs_of(lag), title, xlabel, "replays (count)")
shared = len({id(ax) for _, ax in panels}) == 1
width = 1 / (len(panels) + 1) if shared else 0.8
for i, (run, ax) in enumerate(panels):
    frame = lag.filter(pl.col("run_id") == run)
    ax.bar(frame["lag"].to_numpy() + (i * width if shared else 0), frame["replays"].to_numpy(), width=width, label=run)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
legend(panels)
if SYNTHETIC:
    assert lag["replays"].sum() > 0 and lag["lag"].max() <= 2  # the synthetic runs replay versions >= current - 2
lag"""),
    ("md", "## Zero-variance GRPO groups (all rewards equal: zero advantage, no learning signal)"),
    ("code", """zv = q("zero_variance_groups")
fig, panels = run_panels(runs_of(zv), "Zero-variance GRPO groups by policy version",
                         "policy version (update #)", "zero-variance groups (share, 0-1)", height=3)
for run, ax in panels:
    frame = zv.filter(pl.col("run_id") == run)
    ax.plot(frame["policy_version"], frame["zero_variance_share"], label=run, **style(len(frame)))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True)); ax.set_ylim(0, 1)
legend(panels)
zv"""),
    ("md", "## Truncation rate (responses at the generation cap)"),
    ("code", """trunc = q("truncation_rate")
fig, panels = run_panels(runs_of(trunc), "Truncation rate: responses at the run's longest length",
                         "policy version (update #)", "truncated rollouts (share, 0-1)", height=3)
for run, ax in panels:
    frame = trunc.filter(pl.col("run_id") == run)
    ax.plot(frame["policy_version"], frame["truncation_rate"], label=run, **style(len(frame)))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
legend(panels)
trunc"""),
    ("md", "## Response length vs reward"),
    ("code", """lvr = q("length_vs_reward")
fig, panels = run_panels(runs_of(lvr), "Mean reward by response length (dot area: rollouts)",
                         "response length (tokens, 8-token buckets)", "mean reward (score as pushed)", height=3)
for run, ax in panels:
    frame = lvr.filter(pl.col("run_id") == run)
    ax.scatter(frame["length_bucket"], frame["mean_reward"], s=4 + 60 * frame["rollouts"].to_numpy() / lvr["rollouts"].max(),
               alpha=0.7, label=run)
legend(panels)
lvr"""),
    ("md", """## Per-prompt pass rate over policy versions
The prompts with the most attempts (`TOP_PROMPTS`), one panel per run; with many versions, adjacent versions
share a column (attempts pooled) so no panel has more than `MAX_COLUMNS` columns."""),
    ("code", """passes = q("pass_rate_by_prompt")
top = (passes.group_by("prompt_id").agg(pl.col("attempts").sum())
       .sort(["attempts", "prompt_id"], descending=[True, False]).head(TOP_PROMPTS)["prompt_id"].sort())
v0, v1 = passes["policy_version"].min(), passes["policy_version"].max()
span = -(-(v1 - v0 + 1) // MAX_COLUMNS)  # versions per column
cells = (passes.filter(pl.col("prompt_id").is_in(top.implode()))
         .with_columns(column=(pl.col("policy_version") - v0) // span)
         .group_by("run_id", "prompt_id", "column").agg(rate=pl.col("passes").sum() / pl.col("attempts").sum()))
n_cols, prompt_row = (v1 - v0) // span + 1, {p: i for i, p in enumerate(top)}
runs = runs_of(passes)
ncols = min(3, len(runs)); nrows = -(-len(runs) // ncols)
fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 2.6 * nrows + 1), sharex=True, sharey=True,
                         squeeze=False, layout="constrained")
per = f"{span} versions per column" if span > 1 else "one version per column"
fig.suptitle(f"Pass rate of the {len(top)} most-attempted prompts over policy versions ({per})")
fig.supxlabel(f"policy version (update #; column start, {per})"); fig.supylabel(f"prompt ({len(top)} most attempted, by id)")
for ax, run in zip(axes.flat, runs):
    grid = np.full((len(top), n_cols), np.nan)
    frame = cells.filter(pl.col("run_id") == run)
    grid[[prompt_row[p] for p in frame["prompt_id"]], frame["column"].to_numpy()] = frame["rate"].to_numpy()
    im = ax.imshow(grid, aspect="auto", vmin=0, vmax=1, cmap="viridis", interpolation="nearest",
                   extent=(v0 - 0.5, v0 + n_cols * span - 0.5, len(top) - 0.5, -0.5))
    ax.set_title(run, fontsize=9); ax.xaxis.set_major_locator(MaxNLocator(8, integer=True))
    ax.set_yticks(range(len(top)), top.to_list() if len(top) <= 20 else [""] * len(top))
for ax in axes.flat[len(runs):]:
    ax.set_visible(False)
fig.colorbar(im, ax=axes.ravel().tolist(), label="pass rate (share verified, 0-1)")
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
fig, panels = run_panels(runs_of(reuse), "Reuse per rollout: rollouts by times replayed (as snapshotted)",
                         "times replayed (count)", "rollouts (count, log scale)", height=3)
# one series per run, only the counts that occur: no zeros to draw on a log scale
for run, ax in panels:
    frame = reuse.filter(pl.col("run_id") == run)
    ax.plot(frame["sample_count"], frame["rollouts"], label=run, **style(len(frame)))
    ax.set_yscale("log"); ax.xaxis.set_major_locator(MaxNLocator(integer=True))
legend(panels)
assert reuse["rollouts"].dtype == pl.Int64 and (reuse["rollouts"] > 0).all()
reuse"""),
    ("md", "## Seed a new run with another run's verified history"),
    ("code", """newcomer = view.runs[-1]  # the run to seed: every other run's verified rollouts are candidates
seed_batch = view.sample(32, where=f"run_id <> '{newcomer}' AND verified", columns=["key", "run_id", "prompt_id", "reward"],
                         seed=0, allow_fewer=True)
assert newcomer not in seed_batch.column("run_id").to_pylist()
if SYNTHETIC:
    assert seed_batch.num_rows == 32 and all(seed_batch.column("reward").to_pylist())
pl.from_arrow(seed_batch).head()"""),
]

nb = nbf.v4.new_notebook()
nb.cells = [nbf.v4.new_markdown_cell(src) if kind == "md" else nbf.v4.new_code_cell(src) for kind, src in cells]
nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
Path(__file__).with_name("cross_run_reuse.ipynb").write_text(nbf.writes(nb))
