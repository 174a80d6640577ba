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
# # 14 · 十四、监控训练过程以确保同步有效性 — Monitoring the training process to make sure synchronisation is effective
#
# > **The guide's section, point by point** (its own points in its order, translated; after each arrow: where this
# > notebook shows it with running code, or why it cannot here):
# >
# > 1. Once synchronisation is in place, continuous monitoring is essential. → §1: three runs through hvdsync's
# >    monitor (healthy, one rank nudged, one rank slow).
# > 2. Key signal: whether the workers' loss curves agree closely. → §3: per-rank loss curves.
# > 3. Whether their parameter updates are of similar size. → §3: ‖Δw‖/‖w‖ measured on each rank, equal in
# >    lock-step (asserted).
# > 4. Whether hardware utilisation is balanced. → §3: the node's CPU use from the recorded system metrics (one
# >    machine: not per rank; no GPU here).
# > 5. A node whose loss curve strays, or whose GPU utilisation stays low, points at a problem in its data, compute or
# >    communication. → §1/§2: the nudged rank caught by the parameter fingerprint and named; the slow rank named as
# >    the straggler.
# > 6. Watch the cluster's network I/O for an unexpected bandwidth bottleneck. → §3: bytes received, from the system
# >    metrics.
# > 7. Good monitoring finds problems in time and keeps synchronous training on track. → §2: alarms read back from
# >    MLflow with the rank named.
#
# Synchronous data-parallel training rests on one invariant: **every rank holds the same parameters after every
# step** (same start by broadcast, same averaged gradient, same update). Two things break it or slow it down
# without any error message:
#
# * **divergence**: a rank's parameters drift away (a missed broadcast after a restart, a codec bug, a rank that
#   skipped an update, a non-synchronised buffer). Training goes on and the loss may even look fine on rank 0;
#   the ranks just no longer train the same model.
# * **stragglers**: one rank is slower (a busy host, a slow disk, a throttled GPU). In lock-step training every
#   step then takes as long as that rank's, and *every* rank's step time shows it: step time cannot tell who is
#   slow. What can is each rank's *working* time, its step time minus its wait in the all-reduce: the fast ranks
#   wait, the slow one does not.
#
# Every `monitor.every` steps hvdsync's observer (`hvdsync.core.telemetry.observe`) gathers on rank 0, in one small
# all-gather: a parameter fingerprint per rank (three float64 sums: bitwise equal under synchronous training),
# each rank's loss, step and working time, and the gradient norm. `hvdsync.core.telemetry.monitor.Alarms` raises a
# divergence at once, and a straggler when the same rank works more than `monitor.straggler_ratio` times the
# median of the others (over the last checks, twice in a row). Each alarm is an MLflow tag
# (`hvdsync.alarm.<kind>`, `...rank`), a metric (`alarm/<kind>`) and one warning line naming the rank.
#
# Here we break a run on purpose, twice, and find the culprit in MLflow's data.

# %%
import csv
import tempfile
import time
from pathlib import Path

import matplotlib.pyplot as plt
import mlflow
import numpy as np
import psutil

from hvdsync import launch
from hvdsync.config import Config

folder = Path(tempfile.mkdtemp(prefix="hvdsync-nb14-"))
store = f"sqlite:///{folder / 'mlflow.db'}"
EVERY, NUDGE_STEP, SLOW_MS = 2, 10, 100
base = Config().replace(train={"np": 2, "epochs": 1}, data={"batch_size": 32}, monitor={"every": EVERY},
                        tracking={"tracking_uri": store, "experiment": "nb14", "spool_dir": str(folder / "spool"),
                                  "flush_seconds": 300})   # a busy machine: give the store time
print(f"checks every {EVERY} steps; straggler threshold {base.monitor.straggler_ratio}x the median of the others")


# %% [markdown]
# ## 1 · Three runs: healthy, one rank nudged, one rank slow
#
# The faults enter through hvdsync's public hooks: `build` (here wrapped to keep the backend, i.e. the model) and
# `before_step(epoch, step)`. In the second run rank 1 adds 0.001 to one weight before step 11, something no
# later all-reduce repairs (the gradients are averaged, the parameters are not). In the third run rank 1 sleeps
# 100 ms before each step. In the healthy run the same hook measures each update's size on every rank,
# ||w_t - w_(t-1)|| / ||w_(t-1)|| (for §3).

# %%
def three_runs(raw, nudge_step, slow_ms):
    import torch

    from hvdsync.config import Config
    from hvdlab.fitting import fit_with
    from hvdsync.torch import init
    from hvdsync.torch.train import build

    def run(name, fault):
        held = {}

        def build_and_keep(cfg, data):
            held["backend"] = build(cfg, data)
            return held["backend"]

        cfg = Config.from_dict(raw).replace(tracking={"run_name": name})
        hook = (lambda epoch, step: fault(held["backend"], step)) if fault else None
        return fit_with(init, build_and_keep, cfg, before_step=hook).to_dict()

    def nudge(backend, step):
        if backend.rank == 1 and step == nudge_step:
            with torch.no_grad():
                next(backend.model.parameters()).view(-1)[0] += 1e-3

    def slow(backend, step):
        if backend.rank == 1:
            time.sleep(slow_ms / 1e3)

    updates, previous = [], []

    def measure_update(backend, step):           # the relative size of the update made since the last step
        w = torch.nn.utils.parameters_to_vector(backend.model.parameters()).detach().clone()
        if previous:
            updates.append(float((w - previous[0]).norm() / previous[0].norm()))
        previous[:] = [w]

    return [dict(run("healthy", measure_update), updates=updates), run("nudged", nudge), run("slow", slow)]


net_before = psutil.net_io_counters()
by_rank = launch.run(three_runs, args=(base.to_dict(), NUDGE_STEP, SLOW_MS), np=2)
results = by_rank[0]
net_after = psutil.net_io_counters()
client = mlflow.MlflowClient(store)
runs = {r.info.run_name: r for r in (client.get_run(x["run_id"]) for x in results)}
for x in results:
    print(f"{client.get_run(x['run_id']).info.run_name:8s}: test accuracy {x['test_accuracy']:.3f}; "
          f"warnings: {x['warnings'] or 'none'}")

# %% [markdown]
# ## 2 · What MLflow holds: alarms, named ranks, and the figures behind them

# %%
for name, run in runs.items():
    alarms = {k: v for k, v in run.data.tags.items() if k.startswith("hvdsync.alarm")}
    print(f"{name:8s}: " + ("; ".join(f"{k} = {v}" for k, v in sorted(alarms.items())) or "no alarm"))


def history(run, key):
    h = sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)
    return [m.step for m in h], [m.value for m in h]


def rank_history(run, rank, key):
    """One rank's figure at every check, from the run's ranks.csv (the run's metrics hold the ranks' spread:
    `ranks/<figure>_min|_median|_max` and the slowest rank's id)."""
    with open(client.download_artifacts(run.info.run_id, "ranks.csv", tempfile.mkdtemp())) as f:
        rows = sorted((r for r in csv.DictReader(f) if int(r["rank"]) == rank), key=lambda r: int(r["step"]))
    return [int(r["step"]) for r in rows], [float(r[key]) for r in rows]


# The ranks' step and working times of the slow run are drawn after the question below, which asks for them.
fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
for name, run in runs.items():
    axes[0].plot(*history(run, "monitor/param_spread"), marker=".", label=name)
    axes[1].plot(*history(run, "monitor/straggler_ratio"), marker=".", label=name)
axes[0].axvline(NUDGE_STEP + 1, color="grey", ls=":")
axes[0].set(title="parameter fingerprint spread across ranks", xlabel="step", yscale="symlog")
axes[1].axhline(base.monitor.straggler_ratio, color="grey", ls=":")
axes[1].set(title="slowest rank's working time / median of others", xlabel="step")
for ax in axes:
    ax.legend(fontsize="small")
plt.tight_layout()
plt.show()

# %% [markdown]
# In the slow run rank 1 sleeps 100 ms before each of its steps and rank 0 does not; the steps themselves (a small
# MLP, 32 samples per rank) take a few milliseconds.
#
# **Predict, then run.** What step time, in milliseconds, will the monitor record for rank 0 and for rank 1 in the
# slow run? Write your guess in the next cell (a dict, rank: ms), then run the one after it.

# %%
my_prediction = None   # your guess, e.g. {0: 40.0, 1: 60.0}

# %%
healthy, nudged, slow = runs["healthy"], runs["nudged"], runs["slow"]
assert max(history(healthy, "monitor/param_spread")[1]) == 0.0            # bitwise equal, every check
assert nudged.data.tags["hvdsync.alarm.divergence.rank"] == "1"
first_alarm = min(history(nudged, "alarm/divergence")[0])
assert NUDGE_STEP + 1 <= first_alarm <= NUDGE_STEP + EVERY                # caught at the next check
assert slow.data.tags["hvdsync.alarm.straggler.rank"] == "1"
print(f"divergence injected before step {NUDGE_STEP + 1}, alarm at step {first_alarm}; "
      f"straggler named at step {min(history(slow, 'alarm/straggler')[0])}")
step_ms = {r: round(1e3 * rank_history(slow, r, "step_seconds")[1][-1], 1) for r in (0, 1)}
work_ms = {r: round(1e3 * rank_history(slow, r, "work_seconds")[1][-1], 1) for r in (0, 1)}
print("mean step time in the slow run, rank 0 / rank 1 (ms):", list(step_ms.values()))
# The nudge is invisible in the usual curves: the last recorded loss and the test accuracy barely move.
loss_h, loss_n = history(healthy, "step/loss")[1][-1], history(nudged, "step/loss")[1][-1]
acc_h, acc_n = results[0]["test_accuracy"], results[1]["test_accuracy"]
print(f"healthy vs nudged: last loss {loss_h:.4f} vs {loss_n:.4f}, test accuracy {acc_h:.4f} vs {acc_n:.4f}")
assert abs(loss_n - loss_h) < 0.05 * loss_h and abs(acc_n - acc_h) <= 0.01
# In lock-step the fast rank waits in the all-reduce for the slow one: both step times carry the 100 ms, and only
# the working time (step time minus that wait) tells the ranks apart.
print(f"your prediction: {my_prediction}; measured: step time {step_ms} ms (working time {work_ms} ms)"
      if my_prediction is not None else
      f"measured: step time {step_ms} ms, working time {work_ms} ms "
      "(write a prediction above and run again to compare)")
fig, ax = plt.subplots(figsize=(6, 3.6))
for rank in (0, 1):
    steps, step_s = rank_history(slow, rank, "step_seconds")
    ax.plot(steps, [1e3 * v for v in step_s], ls="--", label=f"rank {rank} step")
    steps, work = rank_history(slow, rank, "work_seconds")
    ax.plot(steps, [1e3 * v for v in work], label=f"rank {rank} working")
ax.set(title="slow run: step time vs working time (ms)", xlabel="step")
ax.legend(fontsize="small")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 3 · The other signals: per-rank loss, update size, utilisation, network I/O
#
# From the healthy run: each rank's own loss every 2 steps (`loss` in `ranks.csv`: each rank on its shard of the step);
# the relative size of every update, ||delta w|| / ||w||, on each rank (watch its level and trend: a jump points at a
# learning rate too high or an exploding gradient, a slide towards zero at learning that stalled); and the node's CPU
# utilisation and network counters, which hvdsync samples with MLflow's psutil monitors on each node's first rank
# and records in the same run (`system/<node>/...`, `hvdsync.core.telemetry.sysmetrics`). On one machine the
# workers talk over loopback, and the counters are the whole machine's (other processes included).

# %%
def system(run, metric):
    keys = [k for k in run.data.metrics if k.startswith("system/") and k.endswith("/" + metric)]
    assert keys, f"no system/<node>/{metric} in the run"
    return history(run, keys[0])


losses = {r: rank_history(healthy, r, "loss") for r in (0, 1)}
updates = np.array(results[0]["updates"])
updates_by_rank = [np.array(by_rank[r][0]["updates"]) for r in (0, 1)]
cpu = system(healthy, "cpu_utilization_percentage")
received = system(healthy, "network_receive_megabytes")
for r, (steps, values) in losses.items():
    third = max(1, len(values) // 3)
    print(f"rank {r}: loss at {len(steps)} checks, mean of the first third {np.mean(values[:third]):.3f}, "
          f"of the last third {np.mean(values[-third:]):.3f}")
    assert np.mean(values[-third:]) < np.mean(values[:third]), f"rank {r}'s loss falls"
print(f"in this run: update size ||dw||/||w|| over {len(updates)} steps: median {np.median(updates):.1e}, "
      f"largest {updates.max():.1e}")
assert 0 < np.median(updates) < 0.1 and np.isfinite(updates).all()
# The guide asks whether the ranks' updates are of similar size: each rank measured its own in the same hook.
gap = np.max(np.abs(updates_by_rank[1] - updates_by_rank[0]) / updates_by_rank[0])
print(f"in this run: update size per rank, median rank 0 {np.median(updates_by_rank[0]):.3e}, rank 1 "
      f"{np.median(updates_by_rank[1]):.3e}; largest relative difference over {len(updates)} steps {gap:.1e}")
assert len(updates_by_rank[1]) == len(updates) and gap < 1e-5, "in lock-step the ranks make the same update"
print(f"in this run: CPU utilisation of the node {np.mean(cpu[1]):.0f}% on average over {len(cpu[1])} samples; "
      f"{received[1][-1]:.2f} MB received on its interfaces while the healthy run was sampled; the whole job "
      f"(three runs) saw the machine's counters move {(net_after.bytes_recv - net_before.bytes_recv) / 1e6:.1f} MB in, "
      f"{(net_after.bytes_sent - net_before.bytes_sent) / 1e6:.1f} MB out (psutil: every process, loopback included)")
assert all(0 <= v <= 100 for v in cpu[1]) and net_after.bytes_recv > net_before.bytes_recv

fig, axes = plt.subplots(1, 3, figsize=(15, 3.6))
for r, (steps, values) in losses.items():
    axes[0].plot(steps, values, marker=".", label=f"rank {r}")
axes[0].set(title="per-rank loss (healthy run)", xlabel="step", ylabel="loss")
axes[0].legend(fontsize="small")
for r, marker in ((0, ".-"), (1, "x")):
    axes[1].semilogy(range(1, len(updates) + 1), updates_by_rank[r], marker, label=f"rank {r}")
axes[1].set(title="update size ||dw|| / ||w|| per rank", xlabel="step")
axes[1].legend(fontsize="small")
axes[2].plot(*cpu, marker=".", color="tab:green")
axes[2].set(title="node CPU % and MB received", xlabel="step", ylabel="CPU utilisation %")
twin = axes[2].twinx()
twin.plot(*received, marker=".", color="tab:purple")
twin.set_ylabel("MB received (cumulative)")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## What to take away
#
# * Under synchronous training the parameters are *bitwise* equal on every rank: a fingerprint compared every N
#   steps costs one small all-gather and catches a divergence at the next check, whatever caused it.
# * Step times are equal across ranks in lock-step training (the fast ranks wait); the slow rank is the one whose
#   *working* time (step minus all-reduce wait) stands out. That is what the straggler alarm compares.
# * Alarms are data: an MLflow tag naming the rank and a metric at the step, next to the ranks' loss and times
#   (`ranks/...`: min, median, max, the slowest rank; every rank's in `ranks.csv`), so a run can be checked after
#   the fact, and one warning line tells whoever is watching.
# * Nudging one weight by 0.001 barely moved the loss or the accuracy (asserted: under 5 % and 1 point):
#   divergence is easy to miss by eye.
# * Beyond alarms: per-rank loss curves (each rank's loss fell, asserted), the update size ||dw|| / ||w|| on each rank
#   (equal on both in lock-step, asserted; this run's medians printed in §3), and the node's utilisation and network counters recorded in the same run tell a
#   stalled or exploding run, and a compute-bound from a communication-bound one.
