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
# # 15 · 十五、梯度压缩与稀疏化 — Gradient compression and sparsification
#
# Every step of synchronous training moves one gradient's worth of bytes per worker (notebook 05: a ring
# all-reduce sends 2(n − 1)/n of it). When the network is the bottleneck, sending *less* is the lever, and there
# are three ways to do it:
#
# * **fewer bits per value** — `fp16`, `bf16` (2 bytes instead of 4) and `int8` (1 byte, stochastic rounding
#   with one scale per tensor: unbiased, so the average over steps is right);
# * **fewer values** — `topk:<ratio>` sends the largest |g|, `randk:<ratio>` a random subset drawn alike on every
#   rank; a 1 % ratio is ~50× fewer bytes even counting top-k's int32 indices;
# * **fewer dimensions** — `powersgd:<rank>` sends a rank-r factorisation P Qᵀ of each weight matrix, refined by
#   one power iteration per step (Vogels et al. 2019).
#
# The lossy ones only work with **error feedback**: each rank keeps the part of its gradient it did not send
# (the *residual*) and adds it to its next gradient, so nothing is lost, only delayed (Stich et al. 2018;
# Lin et al. 2018). hvdsync writes every codec's maths once in `hvdsync.core.comm.codecs` (with its state: residuals,
# step counters, PowerSGD's Q) and runs it with each framework's kernels; `sync.compression: topk:0.01` picks one,
# `sync.error_feedback: false` switches the residual off.
#
# We train digits on 2 Horovod workers with every codec, from the same start for the same steps, with the ranks'
# parameters compared after every step, and count what each hands to Horovod.

# %%
import time

import matplotlib.pyplot as plt
import numpy as np

from hvdsync import launch
from hvdsync.config import Config
from hvdsync.core.comm.codecs import CodecState, get_codec
from hvdlab.codecs_numpy import NumpyOps, simulate

base = Config.from_dict({"train": {"np": 2, "epochs": 8, "optimizer": "sgd", "momentum": 0.0, "lr": 0.5},
                         "tracking": {"enabled": False}})
print(f"digits, MLP 64-{base.train.hidden}-10, plain SGD lr {base.train.lr}, {base.train.epochs} epochs of "
      f"{base.train.np} x {base.data.batch_size} samples per step")

# %% [markdown]
# ## 1 · What error feedback keeps
#
# First the maths alone, in one process: two simulated ranks (`simulate` runs a codec's collectives in numpy)
# send the top 10 % of a gradient. After the step each rank's residual holds exactly what it did not send: zero
# where it sent, the full value elsewhere.

# %%
codec = get_codec("topk:0.1")
rng = np.random.default_rng(0)
grads = [[rng.normal(size=40).astype(np.float32)] for _ in range(2)]
states = [CodecState(codec, [(40,)], NumpyOps()) for _ in range(2)]
combined = simulate(codec, grads, states)[0][0]
residual = states[0].slots[0]["residual"]
sent = grads[0][0] - residual
print(f"rank 0 sent {np.count_nonzero(sent)} of 40 values; residual + sent == gradient exactly: "
      f"{np.array_equal(residual + sent, grads[0][0])}; nonzeros in the combined gradient: "
      f"{np.count_nonzero(combined)} (the two ranks' positions differ)")
assert np.count_nonzero(sent) == codec.k(40) and np.array_equal(residual + sent, grads[0][0])

# %% [markdown]
# ## 2 · Every codec on 2 workers
#
# One `launch.train_many` job trains the 8 variants one after the other (one Horovod start-up). Each run reports
# the bytes its rank handed to Horovod (counted by hvdsync's wire counter: values *and* indices, scales, factors),
# the bytes its codec's formula predicts, the test accuracy per epoch, and the largest difference between the
# ranks' parameter fingerprints after any step.

# %%
variants = [("none", True), ("fp16", True), ("bf16", True), ("int8", True), ("powersgd:2", True),
            ("randk:0.1", True), ("topk:0.01", True), ("topk:0.01", False)]
cfgs = [base.replace(sync={"compression": c, "error_feedback": ef}) for c, ef in variants]
start = time.perf_counter()
results = launch.train_many(cfgs, check_every_step=True)
print(f"{len(cfgs)} trainings on 2 workers in {time.perf_counter() - start:.0f} s (start-up included)")


def label(r):
    s = r["config"]["sync"]
    return s["compression"] + ("" if s["error_feedback"] else " (no EF)")


none = results[0]
print(f"{'codec':<18} {'bytes/step':>10} {'formula':>8} {'x fewer':>8} {'accuracy':>9} {'Δ vs none':>10} ranks equal")
for r in results:
    per_step = r["wire"]["bytes"] / r["optimizer_steps"]
    print(f"{label(r):<18} {per_step:>10.0f} {r['wire_bytes_per_step_formula']:>8} "
          f"{none['wire']['bytes'] / r['wire']['bytes']:>8.1f} {r['test_accuracy']:>9.4f} "
          f"{r['test_accuracy'] - none['test_accuracy']:>+10.4f} {r['step_spread_max'] == 0.0}")
    assert per_step == r["wire_bytes_per_step_formula"], "counted bytes = the codec's formula"
    assert r["step_spread_max"] == 0.0, "identical parameters on both ranks after every step"

# %% [markdown]
# ## 3 · Bytes against accuracy
#
# The Pareto view: each codec is a point (bytes per step on a log axis, final accuracy). The frontier is what no
# other codec beats on both at once.

# %%
points = [(r["wire"]["bytes"] / r["optimizer_steps"], r["test_accuracy"], label(r)) for r in results]
frontier = sorted(p for p in points if not any(q[0] <= p[0] and q[1] > p[1] or q[0] < p[0] and q[1] >= p[1]
                                                for q in points))
fig, ax = plt.subplots(figsize=(8, 4.5))
for b, acc, name in points:
    ax.scatter(b, acc, s=40, color="tab:red" if "no EF" in name else "tab:blue")
    ax.annotate(name, (b, acc), textcoords="offset points", xytext=(5, 4), fontsize=8)
ax.plot([p[0] for p in frontier], [p[1] for p in frontier], "k--", lw=0.8, label="Pareto frontier")
ax.set_xscale("log")
ax.set_xlabel("bytes one rank hands to Horovod per step (counted)")
ax.set_ylabel("test accuracy")
ax.set_title("Gradient codecs on digits, 2 workers, same steps")
ax.legend(fontsize=8)
plt.show()
print("on the frontier:", ", ".join(p[2] for p in frontier))

# %% [markdown]
# ## 4 · Error feedback switched off
#
# The same top-1 % run without the residual: the 99 % of each gradient that is not among the largest values is
# dropped for good, and the coordinates that are never the largest are never trained.

# %%
ef, no_ef = results[-2], results[-1]
fig, ax = plt.subplots(figsize=(7, 3.5))
for r, style in ((none, "k-"), (ef, "b-"), (no_ef, "r--")):
    ax.plot([h["epoch"] + 1 for h in r["history"]], [h["test_accuracy"] for h in r["history"]], style, label=label(r))
ax.set_xlabel("epoch")
ax.set_ylabel("test accuracy")
ax.set_title("top-1 %: with and without error feedback")
ax.legend()
plt.show()
print(f"top-1 % with error feedback {ef['test_accuracy']:.4f}, without {no_ef['test_accuracy']:.4f}, "
      f"no compression {none['test_accuracy']:.4f}")
assert ef["test_accuracy"] > no_ef["test_accuracy"], "error feedback is what makes 1 % sparsification train"
assert none["wire"]["bytes"] / ef["wire"]["bytes"] >= 50

# %% [markdown]
# ## 5 · With momentum: the residual must hold velocity
#
# With SGD momentum 0.9 (hvdsync's default optimizer) plain error feedback goes wrong: a value held back for
# many steps is released at once and then *also* multiplied by the optimizer's momentum, up to 1/(1 − 0.9) = 10×
# later, so the delayed coordinates overshoot. Deep gradient compression (Lin et al. 2018) moves the momentum in
# front of the sparsifier: each rank accumulates its velocity `u = m·u + g`, the residual holds velocity, and a
# coordinate that is sent restarts its velocity from zero (momentum factor masking); the optimizer then steps
# without momentum. `sync.momentum_correction` (on by default) does this for `topk` and `randk`, taking the
# momentum out of the SGD optimizer; here it is switched off for comparison.

# %%
mom = Config.from_dict({"train": {"np": 2, "epochs": 8, "optimizer": "sgd", "momentum": 0.9, "lr": 0.1},
                        "tracking": {"enabled": False}})
mom_runs = launch.train_many([mom.replace(sync={"compression": "none"}),
                              mom.replace(sync={"compression": "topk:0.01", "momentum_correction": True}),
                              mom.replace(sync={"compression": "topk:0.01", "momentum_correction": False})],
                             check_every_step=True)
fig, ax = plt.subplots(figsize=(7, 3.5))
for r, style, name in zip(mom_runs, ("k-", "b-", "r--"), ("none", "top-1 %, momentum correction",
                                                         "top-1 %, no correction")):
    ax.plot([h["epoch"] + 1 for h in r["history"]], [h["test_accuracy"] for h in r["history"]], style, label=name)
    assert r["step_spread_max"] == 0.0
ax.set_xlabel("epoch")
ax.set_ylabel("test accuracy")
ax.set_title("SGD momentum 0.9: top-1 % with and without momentum correction")
ax.legend()
plt.show()
print("final accuracy: " + ", ".join(f"{n} {r['test_accuracy']:.4f}" for n, r in
                                     zip(("none", "corrected", "uncorrected"), mom_runs)))
assert mom_runs[1]["test_accuracy"] > mom_runs[2]["test_accuracy"], "momentum correction is what makes it train"

# %% [markdown]
# One run's final accuracy on digits moves by a point or more from seed to seed, so a single run cannot tell
# "within 1 point" from chance: `python benchmarks/compression.py seeds` runs `none`, corrected and uncorrected top-k
# from 3 seeds in both frameworks (README, "Gradient compression").

# %% [markdown]
# ## What to take away
#
# * **Fewer bits is nearly free.** fp16, bf16 and int8 halve or quarter the bytes and train digits to the
#   accuracy of no compression (the table above); int8's stochastic rounding is unbiased, so its errors average out.
# * **Fewer values needs error feedback.** Top-1 % sends ~50× fewer bytes (indices included); with the residual
#   it keeps up with no compression, without it it falls behind: the residual turns dropped information into
#   delayed information. Rand-k needs a much larger ratio for the same accuracy (its 10 % above) because it
#   ignores which values matter.
# * **With momentum, correct the momentum.** Error feedback on the gradient plus the optimizer's momentum
#   amplifies delayed values; accumulating the velocity in the codec (DGC's momentum correction, on by default)
#   brings top-1 % back to the accuracy of no compression.
# * **Low rank is the best trade for wide layers.** PowerSGD sends r(n + m) numbers per n × m matrix; the saving
#   grows with the layer (10× here on a 64-wide MLP, hundreds of × on `benchmarks/compression.py`'s 4 M-parameter
#   MLP).
# * **Every rank must decode the same thing.** The codecs are written so that the combined gradient is identical
#   on every rank (shared seeds for rand-k and PowerSGD's Q, allgathers in rank order): the parameters were equal
#   after every step of every run. Whether a codec makes a *step* faster depends on the network:
#   `benchmarks/compression.py` measures it, and on a 2-core loopback the encoding competes with the transfer.
