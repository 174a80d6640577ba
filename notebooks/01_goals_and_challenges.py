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
# # 01 · 一、理解同步训练的根本目标与挑战 — Understanding the fundamental goals and challenges of synchronous training
#
# > **The guide's section, point by point** (its own points in its order, translated; after each arrow: where this
# > notebook shows it with running code, or why it cannot here):
# >
# > 1. The final goal: use parallel hardware to train faster while keeping training deterministic and reproducible:
# >    whatever the number of workers, the model should come as close as possible to what sequential training on one
# >    machine would give. → §1: 2 workers × batch B and 1 process × 2B take the same steps (parameters compared after
# >    every step, asserted).
# > 2. Challenge one, communication: workers exchanging gradients or parameters often pay large network or bus
# >    latency. → §2: the share of each step spent in the all-reduce, measured per phase.
# > 3. Challenge two, load balance: when workers run at different speeds, the fast must wait for the slow (the barrel
# >    whose shortest stave sets the level). → §3: one rank slowed on purpose; the other rank's wait grows by about
# >    the delay (measured).
# > 4. Challenge three, fault tolerance: in long, large runs no single node's failure may bring the whole job down. →
# >    §4: arithmetic only (the chance that one of N workers fails in a day, on a stated MTBF); notebook 10 kills real
# >    workers.
# > 5. Understanding these challenges is where designing a synchronisation scheme starts. → the take-aways name the
# >    notebooks that take each challenge further.
#
# **The goal.** Synchronous data-parallel training splits every global batch among W workers. Each worker computes
# the gradient of its share, the workers *all-reduce* (average) their gradients, and every worker applies the same
# averaged gradient to its own copy of the model. If that is done right, the W workers together take exactly the
# step that one process would take on the whole global batch: parallel training is sequential training, only
# faster. Nothing about the model or the optimizer has to change.
#
# **The challenges.** That promise has a price, paid at every step:
#
# * *communication* — the all-reduce moves a gradient's worth of bytes per worker and step, and the update cannot
#   start before it ends;
# * *waiting* — an all-reduce finishes only when the **slowest** worker joins it, so one slow worker sets the pace
#   of all of them;
# * *consistency* — every worker must start from the same parameters, read different samples (notebook 02) and
#   scale its loss so that the average is the global mean.
#
# This notebook measures all three on 2 real Horovod workers (Gloo, on this machine), training a small MLP on
# scikit-learn's handwritten digits with hvdsync:
#
# 1. **the goal, numerically**: 2 workers × batch B against 1 process × batch 2B on the same samples, plain SGD,
#    comparing the parameters after every step;
# 2. **the communication share** of a step, from hvdsync's phase timer (data, compute, sync wait, update);
# 3. **the cost of a slow worker**: rank 1 sleeps before every step, and we watch rank 0's sync wait grow.

# %%
import time

import matplotlib.pyplot as plt
import numpy as np

from hvdsync import launch
from hvdsync.config import Config

# Plain SGD (no momentum) so that "the same step" is easy to state; 32 samples per worker, 2 workers.
cfg = Config().replace(
    train={"np": 2, "epochs": 3, "optimizer": "sgd", "momentum": 0.0, "lr": 0.1, "seed": 0},
    data={"dataset": "digits", "batch_size": 32},
    tracking={"enabled": False},
)
DELAYS_MS = [0, 5, 10, 20, 40]   # artificial delay of rank 1 before every step (experiment 3)
print(f"{cfg.train.np} workers x batch {cfg.data.batch_size} = global batch {cfg.train.np * cfg.data.batch_size}")

# %% [markdown]
# ## The experiments, run on the workers
#
# `launch.run` starts the Horovod workers and calls the function below in each of them (cloudpickle sends it by
# value, so it can live here). To pay for one start-up only, one call runs all three experiments and returns their
# numbers:
#
# 1. `hvdsync.torch.build` + `fit_loop`: the real training loop. Its `before_step` hook copies the parameters
#    before every step. Rank 0 then replays the same epochs as **one process with plain PyTorch**: same initial
#    parameters, batch 2B, the same global sample order (`ShardPlan` with `world_size=1`), the textbook
#    `F.cross_entropy` mean and `torch.optim.SGD`; it records after each step the largest parameter difference.
# 2. `hvdsync.torch.fit(..., before_step=...)` once per delay: on rank 1 the hook sleeps `delay` ms before every
#    step. Each run's `phase_seconds` says where each rank's time went.

# %%
def experiments(cfg_dict, delays_ms):
    import time

    import numpy as np
    import torch

    import hvdsync.torch as ht
    from hvdlab.torch import reference
    from hvdsync.config import Config
    from hvdsync import datasets
    from hvdsync.fitting import fit_loop
    from hvdsync.torch import ShardPlan

    cfg = Config.from_dict(cfg_dict)
    info = ht.init(cfg)
    data = datasets.load(cfg.data, cfg.train.seed)
    out = {"rank": info.rank}

    # 1) 2 workers x B through hvdsync; parameters copied before every step (.copy(): the arrays share the
    #    tensors' memory, which the optimizer updates in place).
    backend = ht.build(cfg, data)
    snapshots = []
    fit_loop(cfg, backend, data, before_step=lambda epoch, step: snapshots.append(
        [p.copy() for p in backend.parameters()]))
    snapshots.append([p.copy() for p in backend.parameters()])

    if info.rank == 0:
        # The sequential reference: one process, batch 2B, no Horovod at all.
        model = ht.mlp(data.n_features, cfg.train.hidden, data.n_classes)
        with torch.no_grad():
            for p, v in zip(model.parameters(), snapshots[0]):
                p.copy_(torch.from_numpy(v))
        plan = ShardPlan(len(data.x_train), info.size, cfg.data.batch_size, seed=cfg.train.seed,
                         shuffle=cfg.data.shuffle)
        diff, moved = [], []

        def compare(i, model):  # after sequential step i, against the parallel model after its step i
            ref = [p.detach().numpy() for p in model.parameters()]
            diff.append(max(float(np.abs(a - b).max()) for a, b in zip(ref, snapshots[i + 1])))
            moved.append(max(float(np.abs(a - b).max()) for a, b in zip(ref, snapshots[0])))

        # Plain torch.optim.SGD on the global batches of 2B, in the plan's order (hvdlab.torch.reference.sequential_sgd).
        reference.sequential_sgd(model, data.x_train, data.y_train, reference.global_batches(plan, cfg.train.epochs),
                          lr=cfg.train.lr, on_step=compare)
        out.update(diff=diff, moved=moved, parallel_steps=len(snapshots) - 1,
                   n_params=sum(p.size for p in snapshots[0]))

    # 2) + 3) where a step's time goes, with rank 1 slowed down by `delay` ms per step.
    timing = cfg.replace(train={"epochs": 2})
    out["runs"] = []
    for delay in delays_ms:
        slow = (lambda epoch, step, delay=delay: time.sleep(delay / 1000)) if info.rank == 1 else None
        result = ht.fit(timing, data=data, before_step=slow)
        out["runs"].append({"delay_ms": delay, "steps": result.optimizer_steps, "phase_seconds": result.phase_seconds,
                            "samples_per_second": result.samples_per_second})
    return out


start = time.perf_counter()
rank0, rank1 = launch.run(experiments, args=(cfg.to_dict(), DELAYS_MS), np=cfg.train.np, sync=cfg.sync,
                          progress=False)
print(f"2 Horovod workers ran all experiments in {time.perf_counter() - start:.1f} s (start-up included)")

# %% [markdown]
# ## 1 · The goal: 2 workers × B equals 1 process × 2B
#
# After every step we compare the 2-worker model with the sequential one, parameter by parameter. The two sides
# add the same numbers in a different order (each worker sums its 32 samples, then Horovod averages the two sums),
# so float32 rounding makes them differ in the last digits: the cell asserts less than 1e-5 after every step, and
# the chart shows the differences this run measured. For scale, the second curve is how far training moved the
# parameters from their start.

# %%
diff, moved = np.array(rank0["diff"]), np.array(rank0["moved"])
assert rank0["parallel_steps"] == len(diff), "both sides must have taken the same number of steps"
print(f"steps compared: {len(diff)}")
print(f"largest parameter difference, 2 workers x B vs 1 process x 2B: {diff.max():.2e}")
print(f"largest parameter change since the start of training:           {moved.max():.2e}")
print(f"difference / change: {diff.max() / moved.max():.1e}")
assert diff.max() < 1e-5, "parallel training must match sequential training up to float32 rounding"
assert diff.max() < 1e-3 * moved.max(), "the difference is orders of magnitude below how far training moved"

fig, ax = plt.subplots(figsize=(8, 3.5))
ax.semilogy(np.arange(1, len(diff) + 1), diff, marker=".", label="|θ(2 workers × B) − θ(1 process × 2B)|, max")
ax.semilogy(np.arange(1, len(moved) + 1), moved, color="grey", ls="--", label="|θ − θ₀|, max (how far training moved)")
ax.axhline(np.finfo(np.float32).eps, color="k", lw=0.7, ls=":", label="float32 machine epsilon")
ax.set_xlabel("optimizer step")
ax.set_ylabel("max abs parameter difference")
ax.set_title("Parallel = sequential, step after step")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# ## 2 · The price: communication in every step
#
# hvdsync's backend times every phase of a step. `sync_wait` is the time a rank waits, after its own backward
# pass, for the all-reduce of its gradients to finish: the communication that did not overlap with computing, plus
# any wait for the other rank. The run below is the one without artificial delay.

# %%
PHASES = ["data", "compute", "sync_wait", "update"]
base = [r["runs"][0] for r in (rank0, rank1)]
for rank, run in enumerate(base):
    total = sum(run["phase_seconds"].values())
    shares = {p: run["phase_seconds"].get(p, 0.0) / total for p in PHASES}
    print(f"rank {rank}: {run['steps']} steps, {1e3 * total / run['steps']:.2f} ms per step; "
          + ", ".join(f"{p} {100 * s:.0f}%" for p, s in shares.items()))
sync_share = base[0]["phase_seconds"]["sync_wait"] / sum(base[0]["phase_seconds"].values())
print(f"in this run: communication (sync wait) was {100 * sync_share:.0f}% of rank 0's step, for a model of "
      f"{rank0['n_params']:,} parameters")
assert sync_share > 0, "every step waits for its all-reduce"

fig, ax = plt.subplots(figsize=(8, 2.5))
for rank, run in enumerate(base):
    left = 0.0
    for p, colour in zip(PHASES, ["tab:grey", "tab:blue", "tab:red", "tab:green"]):
        ms = 1e3 * run["phase_seconds"].get(p, 0.0) / run["steps"]
        ax.barh(f"rank {rank}", ms, left=left, color=colour, label=p if rank == 0 else None)
        left += ms
ax.set_xlabel("ms per step")
ax.set_title("Where a step's time goes (2 workers, MLP on digits)")
ax.legend(ncol=4, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.35))
plt.show()

# %% [markdown]
# The model here is tiny (its parameter count is printed above) and so is its compute, so the all-reduce is a
# large share of each step. Bigger models compute longer per byte of gradient, and above `sync.grouped_mb` hvdsync
# lets Horovod overlap one layer's all-reduce with the backward pass of the layers before it (notebook 07 measures
# how much hides); the bytes to move grow with the model, and the time to move them with a slower network
# (notebook 05 measures the bandwidth).
#
# ## 3 · The price: everyone waits for the slowest worker
#
# Rank 1 now sleeps before every step (as if its data loading or its GPU were slower). Rank 0 does exactly the same
# work as before, yet its `sync_wait` grows with the delay: its all-reduce cannot finish before rank 1 hands in
# its gradient (the cell asserts that rank 0's extra wait is more than half the delay, and prints how much it is in
# this run). The throughput of the *whole* job falls with it (printed and plotted).
#
# **Predict, then run.** When rank 1 sleeps 40 ms before every step (the largest delay), by how many milliseconds per
# step will rank 0's sync wait grow over the run without delay? Write your guess in the next cell (a number of ms),
# then run the one after it.

# %%
my_prediction = None   # your guess, e.g. 5.0

# %%
print(" delay on rank 1 | rank 0 sync wait/step | rank 1 sync wait/step | job samples/s")
waits = {0: [], 1: []}
for r0, r1 in zip(rank0["runs"], rank1["runs"]):
    for rank, run in ((0, r0), (1, r1)):
        waits[rank].append(1e3 * run["phase_seconds"]["sync_wait"] / run["steps"])
    print(f"{r0['delay_ms']:>13} ms | {waits[0][-1]:>18.2f} ms | {waits[1][-1]:>18.2f} ms | "
          f"{r0['samples_per_second']:>12.0f}")
growth = waits[0][-1] - waits[0][0]
print(f"rank 0's sync wait grew by {growth:.1f} ms per step for a {DELAYS_MS[-1]} ms delay on rank 1")
print(f"your prediction: {my_prediction} ms; measured: {growth:.1f} ms" if my_prediction is not None else
      f"measured: {growth:.1f} ms (write a prediction above and run again to compare)")
# Checked on the gap between the ranks, which a machine-wide slowdown (other jobs on these cores) does not open.
gap = (waits[0][-1] - waits[1][-1]) - (waits[0][0] - waits[1][0])
print(f"rank 0 now waits {gap:.1f} ms per step longer than rank 1 than it did without the delay")
assert gap > 0.5 * DELAYS_MS[-1], "the fast rank must wait for the slow one"

fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.5))
a1.plot(DELAYS_MS, waits[0], "o-", label="rank 0 (not slowed)")
a1.plot(DELAYS_MS, waits[1], "s-", label="rank 1 (slowed)")
a1.plot(DELAYS_MS, waits[0][0] + np.array(DELAYS_MS), "k:", lw=0.8, label="rank 0 without delay + delay")
a1.set_xlabel("delay on rank 1 before each step (ms)")
a1.set_ylabel("sync wait per step (ms)")
a1.set_title("The fast rank waits for the slow one")
a1.legend(fontsize=8)
a2.plot(DELAYS_MS, [r["samples_per_second"] for r in rank0["runs"]], "o-", color="tab:purple")
a2.set_xlabel("delay on rank 1 before each step (ms)")
a2.set_ylabel("samples/s (whole job)")
a2.set_title("One slow worker slows the whole job")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 4 · The price: one failure stops everyone
#
# A synchronous step needs every worker's gradient, so one worker that crashes, hangs or loses its network stops
# the whole job: the others block in their all-reduce until a timeout notices (notebook 10 kills a real worker
# and lets an elastic job recover; notebook 04 contrasts an asynchronous parameter server). And failures become
# likely as jobs grow. **This cell is arithmetic, not a measurement**: with each worker failing independently at
# a constant rate (mean time between failures `MTBF_H`, an assumed figure, change it to yours), a job of N workers
# fails at N times that rate, so the chance that a `JOB_H`-hour run sees at least one failure is
# 1 − exp(−N · JOB_H / MTBF_H).

# %%
MTBF_H, JOB_H = 50_000.0, 24.0      # assumptions for the arithmetic, not measured here
workers = np.array([1, 8, 64, 512, 4096])
p_fail = 1 - np.exp(-workers * JOB_H / MTBF_H)
for n, p in zip(workers, p_fail):
    print(f"{n:>5} workers: job MTBF {MTBF_H / n:>8.1f} h, P(at least one failure in {JOB_H:.0f} h) = {p:6.1%}")
assert np.all(np.diff(p_fail) > 0) and p_fail[-1] > 0.8, "with these assumptions, big jobs almost surely fail"

grid = np.logspace(0, 4, 60)
fig, ax = plt.subplots(figsize=(7, 3))
ax.semilogx(grid, 100 * (1 - np.exp(-grid * JOB_H / MTBF_H)))
ax.set_xlabel("workers N"), ax.set_ylabel(f"P(failure in {JOB_H:.0f} h) (%)")
ax.set_title(f"Arithmetic: per-worker MTBF {MTBF_H:,.0f} h (assumed)")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## What to take away
#
# * **Synchronous data parallelism is sequential SGD on the global batch.** 2 workers × 32 samples took the same
#   steps as 1 process × 64 samples: after every step the parameters agreed to float32 rounding (asserted < 1e-5;
#   this run's differences are in the chart), while training moved them by orders of magnitude more (asserted:
#   over 1,000 times more). That is the goal, and it holds only because each worker reads its own share of the
#   *same* global batch, starts from the same parameters and scales its loss so the averaged gradient is the
#   global mean (hvdsync's `ShardPlan`, broadcast and `loss_scale`).
# * **Every step pays for communication.** In this run the sync wait was the share of rank 0's step printed in
#   section 2; it is the price of keeping the copies equal, and it is what compression (fp16), gradient
#   accumulation (notebook 06) and a faster all-reduce (notebook 05) try to lower.
# * **A synchronous job runs at the pace of its slowest worker.** A delay on one rank shows up as waiting on the
#   other rank (asserted: more than half the delay; in this run the printed growth); finding and fixing
#   stragglers (balanced data, equal hardware, no noisy neighbours) is part of scaling.
# * **A synchronous job stops when any worker fails**, and with N workers failures come N times as often
#   (section 4: arithmetic on an assumed MTBF); checkpoints and elastic training (notebook 10) are the answer.
