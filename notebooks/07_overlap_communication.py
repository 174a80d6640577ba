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
# # 07 · 七、通信与计算重叠 — Overlapping communication with computation
#
# Backward computes gradients from the last layer to the first. The last layer's gradient is final long before
# backward is over, so its all-reduce can run *while* the earlier layers are still being differentiated. Horovod's
# `DistributedOptimizer` does exactly that: it registers a hook on every parameter, and the moment a gradient is
# ready the hook hands it to Horovod's background thread, which every `HOROVOD_CYCLE_TIME` fuses what is ready (up
# to `HOROVOD_FUSION_THRESHOLD` bytes) and all-reduces it. Whatever finishes before backward does is **hidden**;
# only the rest shows up as waiting (`sync_wait` in hvdsync's phase timers).
#
# We measure it with Horovod's own instrument, the **timeline** (`HOROVOD_TIMELINE`: a Chrome trace written by
# rank 0 with, per tensor, negotiation, queueing, the fusion-buffer copies and the all-reduce), parsed by
# `hvdsync.core.telemetry.timeline`. The probe (`hvdlab.torch.overlap.probe`) trains an MLP two ways in one job:
#
# * **hooks**: Horovod's `DistributedOptimizer`;
# * **after backward**: a plain backward, then every gradient handed to Horovod (nothing can overlap);
#
# for two **layer orders** with the same layers (big layers at the output end, ready first; or at the input end,
# ready last), at two **fusion thresholds** (0: every gradient on its own; 64 MiB: fused). The hidden share is the
# part of the time during which an all-reduce was running that fell inside a backward pass.

# %%
import tempfile
import time
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from hvdsync import launch
from hvdsync.config import SyncConfig
from hvdsync.core.telemetry import timeline
from hvdlab.torch import overlap

folder = Path(tempfile.mkdtemp(prefix="hvdsync-nb07-"))
THRESHOLDS = [0, 64]
jobs = {}
start = time.perf_counter()
for mb in THRESHOLDS:
    path = folder / f"timeline-fusion{mb}.json"
    rows = launch.run(overlap.probe, kwargs={"batch": 256, "steps": 4, "warmup": 1}, np=2,
                      sync=SyncConfig(fusion_threshold_mb=mb), env={"HOROVOD_TIMELINE": str(path)},
                      progress=False)[0]
    jobs[mb] = (rows, timeline.read(path))
print(f"2 jobs x 2 orders x 2 variants in {time.perf_counter() - start:.0f} s; "
      f"widths big_last {overlap.layer_widths('big_last')}, big_first {overlap.layer_widths('big_first')}")

# %% [markdown]
# ## 1 · How much of the all-reduce hides behind backward

# %%
table = []
for mb, (rows, tl) in jobs.items():
    for row in rows:
        spans = tl.select(op="ALLREDUCE", name=row["bytes"].__contains__, between=row["segment"])
        assert {s.name for s in spans} == set(row["bytes"]), "every gradient appears in the timeline"
        hidden = timeline.overlap(spans, row["backward"])
        busy = timeline.busy_seconds(spans) / len(row["backward"])
        backward = np.mean([b - a for a, b in row["backward"]])
        table.append((mb, row["order"], row["variant"], hidden, busy, backward, np.median(row["step_seconds"])))
print("fusion | layer order | variant        | hidden | all-reduce busy/step | backward | step (median)")
for mb, order, variant, hidden, busy, backward, step in table:
    print(f"{mb:>3} MiB | {order:11} | {variant:14} | {hidden:6.1%} | {busy * 1e3:12.1f} ms       | "
          f"{backward * 1e3:5.1f} ms | {step * 1e3:6.1f} ms")
assert all(h < 0.05 for _, _, v, h, *_ in table if v == "after_backward")   # nothing can hide there

# %%
fig, ax = plt.subplots(figsize=(9, 3.4))
labels = [f"{o}\n{mb} MiB" for mb in THRESHOLDS for o in ("big_last", "big_first")]
for i, variant in enumerate(overlap.VARIANTS):
    vals = [h for mb in THRESHOLDS for o in ("big_last", "big_first")
            for m, oo, v, h, *_ in table if (m, oo, v) == (mb, o, variant)]
    ax.bar(np.arange(len(labels)) + 0.4 * (i - 0.5), np.array(vals) * 100, 0.4, label=variant)
ax.set_xticks(np.arange(len(labels)), labels)
ax.set_ylabel("all-reduce time hidden (%)"), ax.legend(), ax.set_title("from Horovod's timeline, 2 workers")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 2 · Per tensor: when ready, when reduced
#
# One timed step of each variant (big layers last, no fusion): the grey band is backward, a dot is the moment
# the gradient was ready (a post-accumulate hook in the worker), the bar is its all-reduce in Horovod's timeline
# (epoch-aligned: Horovod writes its start time since the epoch at the top of the file).

# %%
fig, axes = plt.subplots(1, 2, figsize=(12, 3.8), sharey=True)
rows, tl = jobs[0]
for ax, variant in zip(axes, overlap.VARIANTS):
    row = next(r for r in rows if r["order"] == "big_last" and r["variant"] == variant)
    b0, b1 = row["backward"][1]
    step_spans = tl.select(op="ALLREDUCE", name=row["bytes"].__contains__, between=(b0 - 0.05, b1 + 0.5))
    names = list(row["bytes"])[::-1]
    ax.axvspan(0, (b1 - b0) * 1e3, color="0.85", label="backward")
    for y, name in enumerate(names):
        # The first all-reduce of this tensor in the step's window; the window starts 50 ms early because the two
        # clocks (Horovod's timeline, the worker's hooks) are aligned only to within a few ms.
        spans = [s for s in step_spans if s.name == name]
        if spans:
            span = min(spans, key=lambda s: s.start)
            ax.barh(y, (span.end - span.start) * 1e3, left=(span.start - b0) * 1e3, color="tab:blue")
        ready = min(t for t in row["ready"][name] if t >= b0)
        ax.plot((ready - b0) * 1e3, y, "o", color="tab:red", ms=4)
    ax.set_yticks(range(len(names)), [f"{n} ({row['bytes'][n] / 2**20:.2f} MiB)" for n in names], fontsize=7)
    ax.set_xlabel("ms since backward started"), ax.set_title(variant)
axes[0].legend(loc="lower right")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## What to take away
#
# * Horovod starts each gradient's all-reduce from a hook as soon as backward produces it, so part of the
#   communication runs while backward is still computing; an all-reduce started after backward hides nothing.
# * The timeline is the instrument: per tensor it shows when the request arrived, when the collective ran and what
#   it did; `hvdsync.core.telemetry.timeline` turns it into spans comparable with the workers' clocks.
# * Layer order matters: gradients of layers near the output are ready first. Big layers there leave the rest of
#   backward to hide their all-reduce; big layers near the input are ready last, with little left to hide behind.
# * The fusion threshold trades per-message latency (many small all-reduces) against waiting to fill a buffer;
#   which wins depends on the sizes, the cycle time and the link (on this 2-core machine the workers and Horovod's
#   threads also compete for the same cores, which limits how much can overlap at all).
