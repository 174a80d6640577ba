# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 11 · 十一、性能分析 — Profiling
#
# A synchronous step is a chain: each rank **waits for data**, runs **forward and backward**, **waits for the
# all-reduce** to finish, and **updates** its parameters. The slowest link decides the speed, and the link that
# matters changes with the model: a small model spends its step waiting on communication (every all-reduce pays a
# fixed latency, notebook 05), a large one computing. Before tuning anything (compression, accumulation, fusion
# buffers, more workers) you need to know which link it is, and on which rank.
#
# hvdsync times each phase on every rank (`hvdsync.core.telemetry.profiling.PhaseTimer`: `data`, `compute` = forward and
# backward, `sync_wait`, `update`) and every `monitor.every` steps gathers the figures on rank 0, which records them
# in the job's one MLflow run as `rank/<r>/<phase>_seconds` and `rank/<r>/comm_share` (the share of the step spent
# waiting on communication). `sync_wait` holds the communication that compute did not hide *plus* the time a
# rank waits for slower ranks to arrive; notebook 14 takes those apart.
#
# Inside the all-reduce, Horovod's own **timeline** (`HOROVOD_TIMELINE`, switched on by `tracking.timeline` or
# `hvdsync train --timeline`) shows per tensor how long it took to *negotiate* (all ranks announcing the tensor is
# ready), how long it *queued*, copied into the fusion buffer, and was reduced. hvdsync parses it
# (`hvdsync.core.telemetry.profiling.parse_timeline`) and records a per-tensor chart with the run.
#
# Here: three model sizes in one pair of workers, everything read back from MLflow.

# %%
import json
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import mlflow
import numpy as np

from hvdsync import launch
from hvdsync.config import Config
from hvdsync.core.telemetry.profiling import PHASES, TIMELINE_PARTS

folder = Path(tempfile.mkdtemp(prefix="hvdsync-nb11-"))
store = f"sqlite:///{folder / 'mlflow.db'}"
SIZES = (1024, 128, 16)           # hidden units: from compute-heavy to latency-bound
cfgs = [Config().replace(train={"np": 2, "epochs": 2, "hidden": h}, data={"batch_size": 64},
                         tracking={"tracking_uri": store, "experiment": "nb11", "run_name": f"hidden={h}",
                                   "spool_dir": str(folder / "spool"), "timeline": True,
                                   "flush_seconds": 300},   # a busy machine: give the store time
                         monitor={"every": 5}) for h in SIZES]
print(f"store {store}; models with {', '.join(map(str, SIZES))} hidden units; monitor every 5 steps")


# %% [markdown]
# ## 1 · Three models, one job
#
# One `launch.run` starts two workers that train the three models one after the other (a Horovod start costs
# seconds). Horovod reads `HOROVOD_TIMELINE` once, when it starts, so the timeline covers the whole job; the first
# run (the largest model) records it as it was when that run ended.

# %%
def train_sizes(raw_cfgs):
    import hvdsync.torch as hs
    from hvdsync.config import Config

    return [hs.fit(Config.from_dict(raw)).to_dict() for raw in raw_cfgs]


results = launch.run(train_sizes, args=([c.to_dict() for c in cfgs],), np=2)[0]
client = mlflow.MlflowClient(store)
for h, r in zip(SIZES, results):
    print(f"hidden={h:5d}: test accuracy {r['test_accuracy']:.3f}, {r['samples_per_second']:.0f} samples/s, "
          f"MLflow run {r['run_id']}")

# %% [markdown]
# ## 2 · Where a step's time goes, per rank
#
# For every run and rank: the mean of each phase over the recorded intervals (the first interval, with its
# one-off start-up costs, is left out), read back from MLflow.

# %%
def mean_after_first(run_id, key):
    values = [m.value for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)]
    return float(np.mean(values[1:] if len(values) > 1 else values))


table = {}
for h, r in zip(SIZES, results):
    for rank in (0, 1):
        phases = {p: 1e3 * mean_after_first(r["run_id"], f"rank/{rank}/{p}_seconds") for p in PHASES}
        step = 1e3 * mean_after_first(r["run_id"], f"rank/{rank}/step_seconds")
        table[(h, rank)] = {**phases, "step": step,
                            "comm_share": mean_after_first(r["run_id"], f"rank/{rank}/comm_share")}
        print(f"hidden={h:5d} rank {rank}: " + ", ".join(f"{p} {phases[p]:6.2f}" for p in PHASES)
              + f" | step {step:6.2f} ms | waiting on communication {table[(h, rank)]['comm_share']:.0%}")

fig, axes = plt.subplots(1, 2, figsize=(12, 4))
labels = [f"{h}\nrank {rank}" for h, rank in table]
bottom = np.zeros(len(table))
for p in PHASES:
    ms = np.array([v[p] for v in table.values()])
    axes[0].bar(labels, ms, bottom=bottom, label=p)
    bottom += ms
axes[0].set(title="ms per step by phase (hidden units, rank)", ylabel="ms")
axes[0].legend()
axes[1].bar([str(h) for h in SIZES], [np.mean([table[(h, r)]["comm_share"] for r in (0, 1)]) for h in SIZES])
axes[1].set(title="share of the step waiting on communication", xlabel="hidden units", ylim=(0, 1))
plt.tight_layout()
plt.show()

shares = [np.mean([table[(h, r)]["comm_share"] for r in (0, 1)]) for h in SIZES]
print("in this run, the share of the step spent waiting on communication by model size: "
      + ", ".join(f"{h} hidden {s:.0%}" for h, s in zip(SIZES, shares))
      + f"; the smallest model's share is the largest: {shares[SIZES.index(min(SIZES))] == max(shares)}")
# The phases are parts of the step, so together they never exceed it (the rest is the loop's own work).
for v in table.values():
    assert sum(v[p] for p in PHASES) <= v["step"] * 1.001 + 1e-6
    assert 0.0 <= v["comm_share"] <= 1.0

# %% [markdown]
# ## 3 · Inside the all-reduce: Horovod's timeline
#
# The first run's artifacts hold the timeline and its per-tensor parts. hvdsync's optimizer hands Horovod one
# gradient per parameter tensor: a small model's all in one grouped call after backward (`sync.grouped_mb`),
# named `hvdsync.grouped_<i>of<n>` in the order of the parameters' names; a larger model's from one hook per
# tensor, named after the parameter.

# %%
first = results[0]["run_id"]
files = [a.path for a in client.list_artifacts(first, "horovod")]
parts = json.loads(Path(client.download_artifacts(first, "horovod/timeline_tensors.json", str(folder))).read_text())
print("artifacts:", ", ".join(sorted(files)))
grads = {k: v for k, v in parts.items() if v["allreduce"] > 0}
for name, v in sorted(grads.items(), key=lambda kv: -sum(kv[1].values()))[:6]:
    print(f"{name:40s} " + ", ".join(f"{p} {1e3 * v[p]:7.1f} ms" for p in TIMELINE_PARTS))
rows = sorted(grads.items(), key=lambda kv: -sum(kv[1].values()))[:8][::-1]
left = np.zeros(len(rows))
plt.figure(figsize=(9, 3.5))
for p in TIMELINE_PARTS:
    ms = np.array([1e3 * v[p] for _, v in rows])
    plt.barh([k[-40:] for k, _ in rows], ms, left=left, label=p)
    left += ms
plt.xlabel("ms over the run")
plt.title("per tensor: negotiate, queue, copy and reduce")
plt.legend(fontsize="small")
plt.tight_layout()
plt.show()
# The MLP has 4 parameter tensors (2 weights, 2 biases): each was all-reduced.
assert len(grads) >= 4 and "horovod/timeline.png" in files

# %% [markdown]
# ## What to take away
#
# * Profile per rank and per phase before tuning: `rank/<r>/<phase>_seconds` and `rank/<r>/comm_share` in the
#   job's MLflow run show which link of the chain is slow, and on which rank.
# * The smaller the model, the larger the share of a step spent waiting on communication (this run's shares are
#   printed above): each all-reduce pays a latency whatever its size. Fewer, larger all-reduces (tensor fusion, `sync.accumulate`) help there; compression
#   helps when the *bytes* dominate (large models, slow links).
# * `sync_wait` is communication that compute did not hide plus waiting for slower ranks; a large `sync_wait` on
#   one rank with a short one on another points at a straggler, not at the network (notebook 14).
# * `--timeline` records Horovod's own view per tensor: long *negotiate* means ranks reach the all-reduce at
#   different times; long *queue* means the background thread is busy with earlier tensors.
