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
# # 13 · 十三、在特定场景下权衡同步与异步更新的取舍 — Weighing synchronous against asynchronous updates in particular scenarios
#
# > **The guide's section, point by point** (its own points in its order, translated; after each arrow: where this
# > notebook shows it with running code, or why it cannot here):
# >
# > 1. The opposite of synchronous training: asynchronous updates, where a worker updates the global parameters as
# >    soon as its gradient is ready, without waiting for the others. → §2: asynchronous SGD in 20 lines (one
# >    process), equal to the package's replay.
# > 2. Waiting disappears, but gradients go stale: a worker may compute on parameters several versions old. → §3:
# >    accuracy against the staleness bound tau.
# > 3. That can slow convergence and lower final accuracy. → §3: at tau 32 without damping, more than 20 points lost
# >    (asserted).
# > 4. In practice, training speed is traded against stable convergence. → §1: local SGD with H = 1, 4, 8 on 2 real
# >    workers, rounds counted against accuracy (time printed).
# > 5. For large models, data with little noise, or extreme speed needs, semi-synchronous or delay-compensated
# >    asynchronous algorithms can complement it. → §1 local and post-local SGD (semi-synchronous), §3 damping by the
# >    delay, §4 DC-ASGD against plain async.
#
# Synchronous data parallelism (everything so far) makes every rank all-reduce its gradient at every step: all
# ranks hold the same model at all times, and every step waits for the slowest rank and for the network. Two ways
# to loosen the lock-step:
#
# * **Communicate less often: local SGD** (Stich, ICLR 2019). Each rank takes H optimizer steps on its own
#   gradients, then all ranks average their parameters in one all-reduce: H times fewer rounds. Between averagings
#   the ranks drift apart; the average pulls them back. **Post-local SGD** (Lin et al., ICLR 2020) trains the first
#   steps synchronously (where the loss falls fastest) and goes local afterwards. In hvdsync:
#   `sync.mode: local_sgd`, `sync.period: H`, `sync.warmup_steps: N`, for PyTorch and Keras 3
#   (`hvdsync/torch/schemes/local_sgd.py`, `hvdsync/tensorflow/schemes/local_sgd.py`;
#   the schedule is `hvdsync.core.comm.schemes.local_sgd`).
#   The optimizer state (momentum) is averaged with the parameters, in the same all-reduce, so right after an
#   averaging the ranks share one model *and* one optimizer state.
# * **Do not wait at all: asynchronous SGD.** A parameter server applies each worker's gradient as it arrives; by
#   then the parameters have moved on, so the gradient is *stale* by s updates. Under a staleness bound tau
#   (stale synchronous parallel), `x_{t+1} = x_t − lr·d(s)·∇f(x_{t−s}; batch_t)`. `hvdlab.staleness`
#   replays exactly that (the delay queue, the damping rules d) and `hvdlab.torch.staleness` runs it on the real
#   MLP in this process; tau = 0 is synchronous SGD over the same batches.
#
# Below: local SGD with H ∈ {1, 4, 8} and post-local SGD against synchronous SGD on 2 Horovod workers, at the same
# samples (rounds counted by the optimizers as they issue them, accuracy, time); then accuracy against staleness,
# with and without damping.

# %%
import matplotlib.pyplot as plt
import numpy as np

from hvdsync import launch
from hvdsync.config import Config
from hvdsync.core.comm.schemes import local_sgd
from hvdlab.torch.modes import train_modes
from hvdlab.torch.staleness import simulate

# 4 epochs of digits at 2 x 32 samples per step: 22 steps per epoch, 88 steps, a multiple of 4 and 8, so the run
# ends on an averaging and the final accuracy is the averaged model's.
cfg = Config().replace(train={"np": 2, "epochs": 4, "seed": 3, "lr": 0.1}, data={"batch_size": 32},
                       tracking={"enabled": False})
# The first run of a job also pays Horovod's first collectives and the imports: a throw-away run takes that, so the
# times below compare like with like.
MODES = {"(warm-up)": {}, "synchronous": {}, "local H=1": {"mode": "local_sgd", "period": 1},
         "local H=4": {"mode": "local_sgd", "period": 4}, "local H=8": {"mode": "local_sgd", "period": 8},
         "post-local 8+H=8": {"mode": "local_sgd", "period": 8, "warmup_steps": 8}}

# %% [markdown]
# ## 1 · Local SGD on two real workers
#
# The same MLP from the same start over the same samples (SGD with momentum 0.9), once per mode. Each rank records
# a fingerprint of its parameters after every step, to see when the ranks agree.
#
# **Predict, then run.** Synchronous SGD all-reduces the gradients at every step; local SGD averages the parameters,
# and the momentum with them, every H steps. Over the same 88 steps, how many bytes do local H = 1, H = 4 and H = 8
# hand over to Horovod, relative to synchronous SGD? Write your guesses in the next cell, then run the one after it.

# %%
my_prediction = None   # your guesses, e.g. {"local H=1": 1.0, "local H=4": 1.0, "local H=8": 1.0}

# %%
runs = launch.run(train_modes, args=(cfg.to_dict(), MODES), kwargs={"trace": True}, np=2, sync=cfg.sync,
                  progress=False)
r0, r1 = ({k: v for k, v in r.items() if k != "(warm-up)"} for r in runs)
sync_acc = r0["synchronous"]["accuracy"]
print(f"{'mode':17} {'steps':>5} {'rounds':>6} {'x fewer':>7} {'MB handed over':>14} {'accuracy':>8} {'gap':>6} {'seconds':>7}")
for name, r in r0.items():
    print(f"{name:17} {r['steps']:5} {r['rounds']:6} {r0['synchronous']['rounds'] / r['rounds']:7.1f} "
          f"{r['wire']['bytes'] / 1e6:14.2f} {r['accuracy']:8.3f} {(r['accuracy'] - sync_acc) * 100:+6.1f} "
          f"{r['seconds']:7.1f}")
steps = r0["synchronous"]["steps"]
assert r0["synchronous"]["rounds"] == steps and r0["local H=4"]["rounds"] * 4 == steps
assert r0["local H=8"]["rounds"] == local_sgd.rounds(steps, 8)
assert r0["post-local 8+H=8"]["rounds"] == local_sgd.rounds(steps, 8, warmup=8)
assert abs(r0["local H=4"]["accuracy"] - sync_acc) <= 0.02
sync_bytes = r0["synchronous"]["wire"]["bytes"]
byte_ratios = {n: r0[n]["wire"]["bytes"] / sync_bytes for n in ("local H=1", "local H=4", "local H=8")}
shown = ", ".join(f"{n} {v:.2f}" for n, v in byte_ratios.items())
print(f"your prediction: {my_prediction}; measured: {shown}" if my_prediction is not None else
      f"measured: {shown} (write a prediction above and run again to compare)")

# %% [markdown]
# H = 1 averages parameters and momentum after every step: for SGD with momentum that is the same arithmetic as
# averaging the gradients (both are linear), so it matches synchronous SGD, at twice the bytes (the momentum rides
# along). With H = 4 and 8 the rounds fall 4x and 8x; the bytes only 2x and 4x, since each round carries the
# momentum too. Checked here on the counts above; the time column is this shared 2-core machine's loopback, where
# an all-reduce of this small MLP costs little next to the Python step: it is printed, not claimed for a real
# network.

# %%
print("bytes handed over, relative to synchronous SGD: "
      + ", ".join(f"{n} {v:.3f}" for n, v in byte_ratios.items()))
print(f"accuracy, local H=1 vs synchronous: {r0['local H=1']['accuracy']:.4f} vs {sync_acc:.4f}")
print(f"in this run: synchronous SGD took {r0['synchronous']['seconds']:.1f} s, local H=8 "
      f"{r0['local H=8']['seconds']:.1f} s")
assert abs(r0["local H=1"]["accuracy"] - sync_acc) <= 0.01, "H = 1 is synchronous SGD up to rounding"
for n, expected in (("local H=1", 2.0), ("local H=4", 0.5), ("local H=8", 0.25)):
    assert abs(byte_ratios[n] - expected) < 0.02 * expected, (n, byte_ratios[n])

# %%
spread = {}
for name in ("local H=4", "local H=8", "post-local 8+H=8"):
    a, b = (np.array(r[name]["fingerprints"]) for r in (r0, r1))
    spread[name] = np.max(np.abs(a - b), axis=1)
    period, warmup = MODES[name]["period"], MODES[name].get("warmup_steps", 0)
    agree = [local_sgd.synchronous(t, warmup) or local_sgd.averages_after(t, period, warmup)
             for t in range(1, steps + 1)]
    assert all((spread[name][t] == 0) == agree[t] for t in range(steps))
warm = MODES["post-local 8+H=8"]["warmup_steps"]
early = {n: float(spread[n][:warm].max()) for n in ("local H=8", "post-local 8+H=8")}
print(f"largest rank difference in the first {warm} steps: local H=8 {early['local H=8']:.3g}, post-local "
      f"{early['post-local 8+H=8']:.3g}; in this run test accuracy local H=8 {r0['local H=8']['accuracy']:.4f}, "
      f"post-local {r0['post-local 8+H=8']['accuracy']:.4f}")
assert early["post-local 8+H=8"] == 0.0 < early["local H=8"], "post-local SGD: no drift during its warm-up"

fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 3.6))
for name, s in spread.items():
    a1.plot(range(1, steps + 1), np.maximum(s, 1e-9), ".-", ms=3, lw=0.6, label=name)
a1.set_yscale("log"), a1.set_xlabel("step"), a1.set_ylabel("|fingerprint rank 0 − rank 1|")
a1.set_title("ranks drift apart, each averaging makes them equal"), a1.legend(fontsize=8)
names = list(r0)
a2.bar(names, [r0[n]["rounds"] for n in names], color="tab:blue")
for i, n in enumerate(names):
    a2.text(i, r0[n]["rounds"], f"{r0[n]['accuracy']:.3f}", ha="center", va="bottom", fontsize=8)
a2.set_ylabel("all-reduce rounds (counted)"), a2.set_title("rounds in 88 steps (label: test accuracy)")
a2.tick_params(axis="x", labelrotation=20, labelsize=8)
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 2 · The mechanism: asynchronous SGD in 20 lines
#
# A parameter server applies each gradient to the *newest* parameters, but the worker computed it on the version it
# read s updates ago. Replayed in one process: keep the last tau + 1 versions, compute batch t's gradient on the
# version s_t updates old, apply it to the newest. Below, in numpy, on a softmax regression over the digits (168
# batches of 32, about 4 epochs, the same for every run); `compensate` is §4's delay compensation. Then the
# package's replay (`hvdlab.staleness.run_async`, which the torch simulation in §3 uses) on the same model must give
# the same parameters, bit for bit, for both staleness patterns.

# %%
from hvdlab.staleness import run_async
from hvdsync.datasets import load

dg = load(cfg.data, 0)
X, Y, XT, YT = dg.x_train, dg.y_train, dg.x_test, dg.y_test
batches = np.random.default_rng(0).permutation(np.tile(np.arange(len(X)), 4))[:168 * 32].reshape(168, 32)


def grad(w, t):                                  # softmax regression's cross-entropy gradient on batch t
    z = X[batches[t]] @ w
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.arange(32), Y[batches[t]]] -= 1
    return X[batches[t]].T @ p / 32


def async_sgd(w0, lr, tau, kind="fixed", seed=0, compensate=0.0):
    late = np.random.default_rng(seed).integers(0, tau + 1, len(batches)) if kind == "uniform" else \
        np.full(len(batches), tau)               # fixed: every gradient tau late; uniform: 0..tau
    versions, w = [w0.copy()], w0.copy()         # the last tau + 1 versions, newest last
    for t in range(len(batches)):
        stale = versions[-1 - min(int(late[t]), t)]   # the version the worker read (never older than the start)
        g = grad(stale, t)
        if compensate:                           # DC-ASGD: first-order correction of g towards w
            g = g + compensate * g * g * (w - stale)
        w = w - lr * g                           # applied to the newest parameters
        versions = (versions + [w.copy()])[-(tau + 1):]
    return w


w0 = np.zeros((64, 10), np.float32)
for kind in ("fixed", "uniform"):
    mine = async_sgd(w0, 1.0, 8, kind)
    package = run_async(w0.copy(), len(batches), grad, lambda x, g, lr: x - lr * g, 1.0, 8, kind=kind,
                        copy=np.copy).params
    print(f"{kind:7}: tau 8, largest difference inline vs hvdlab.staleness.run_async: "
          f"{np.abs(mine - package).max():.1f}")
    assert np.array_equal(mine, package)

# %% [markdown]
# ## 3 · Asynchronous SGD: accuracy against staleness
#
# Plain SGD (no momentum: momentum is itself a delayed gradient) at lr 0.3 on the MLP, 4 epochs of batches of 32,
# the same batches in the same order for every run. Two staleness patterns: **fixed**, every gradient tau updates
# late (tau + 1 equal workers taking turns), and **uniform**, each gradient 0..tau late (uneven workers under a
# bound). Damping: `none`; `bound`, lr / (1 + tau) for every gradient; `staleness`, lr / (1 + s) per gradient.

# %%
TAUS = (0, 1, 2, 4, 8, 16, 32)
scfg = cfg.replace(train={"lr": 0.3, "epochs": 4, "seed": 0})
stale = {kind: simulate(scfg, TAUS, ("none", "bound", "staleness"), kind=kind) for kind in ("fixed", "uniform")}
for kind, out in stale.items():
    for damping in ("none", "bound", "staleness"):
        print(f"{kind:7} {damping:9}: " + "  ".join(f"tau {t:2} {out[(damping, t)]['accuracy']:.3f}" for t in TAUS))
sync_sgd = stale["fixed"][("none", 0)]["accuracy"]
assert stale["fixed"][("none", 32)]["accuracy"] < sync_sgd - 0.2              # staleness breaks plain SGD
assert stale["uniform"][("staleness", 32)]["accuracy"] > stale["uniform"][("none", 32)]["accuracy"] + 0.2
u = stale["uniform"]
print(f"in this run, uniform staleness at tau 32: per-gradient damping {u[('staleness', 32)]['accuracy']:.3f}, "
      f"damping by the bound {u[('bound', 32)]['accuracy']:.3f}, none {u[('none', 32)]['accuracy']:.3f}; "
      f"synchronous {sync_sgd:.3f}")

fig, axes = plt.subplots(1, 2, figsize=(11, 3.6), sharey=True)
for ax, (kind, out) in zip(axes, stale.items()):
    for damping, style in (("none", "o-"), ("bound", "s--"), ("staleness", "^-")):
        ax.plot(TAUS, [out[(damping, t)]["accuracy"] for t in TAUS], style, label=damping)
    ax.axhline(sync_sgd, color="grey", lw=0.8, ls=":", label="synchronous (tau 0)")
    ax.set_xscale("symlog", base=2), ax.set_xlabel("staleness bound tau"), ax.set_title(f"{kind} staleness")
axes[0].set_ylabel("test accuracy"), axes[0].legend(fontsize=8)
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 4 · Delay-compensated async SGD (DC-ASGD)
#
# Zheng et al. (ICML 2017) correct a stale gradient instead of shrinking it: the gradient at the newest parameters
# w is approximately g(w_stale) + H (w - w_stale), and the Hessian H is approximated cheaply by the outer product of
# the gradient, diagonal only, times a factor lambda: `g + lambda * g * g * (w - w_stale)` (the `compensate` line
# above). The softmax regression of §2 at lr 1.0, every gradient tau late, lambda 0.5, against plain async SGD at
# the same staleness and batches.

# %%
def scores(w):
    z = X @ w
    z = z - z.max(1, keepdims=True)
    loss = float(np.mean(np.log(np.exp(z).sum(1)) - z[np.arange(len(X)), Y]))
    return loss, float(np.mean((XT @ w).argmax(1) == YT))


LAMBDA, DC_TAUS = 0.5, (0, 8, 16)
dc = {(name, tau): scores(async_sgd(w0, 1.0, tau, compensate=lam))
      for tau in DC_TAUS for name, lam in (("plain", 0.0), ("DC-ASGD", LAMBDA))}
for tau in DC_TAUS:
    (lp, ap), (ld, ad) = dc[("plain", tau)], dc[("DC-ASGD", tau)]
    print(f"tau {tau:2}: training loss plain {lp:7.3f}, DC-ASGD {ld:7.3f}; test accuracy plain {ap:.3f}, "
          f"DC-ASGD {ad:.3f}")
assert dc[("plain", 0)] == dc[("DC-ASGD", 0)], "no delay, nothing to compensate"
for tau in DC_TAUS[1:]:
    assert dc[("DC-ASGD", tau)][0] < dc[("plain", tau)][0], f"compensation lowers the loss at tau {tau}"
print(f"in this run: at tau 16 DC-ASGD reached {dc[('DC-ASGD', 16)][1]:.3f} test accuracy, plain async "
      f"{dc[('plain', 16)][1]:.3f}, synchronous (tau 0) {dc[('plain', 0)][1]:.3f}")

fig, ax = plt.subplots(figsize=(7, 3.2))
for name, style in (("plain", "o-"), ("DC-ASGD", "^-")):
    ax.plot(DC_TAUS, [dc[(name, t)][1] for t in DC_TAUS], style, label=f"{name}")
ax.set(xlabel="staleness tau (every gradient)", ylabel="test accuracy",
       title="Delay compensation at the same staleness (softmax regression, lr 1.0)")
ax.legend(fontsize=8)
plt.tight_layout()
plt.show()

# %% [markdown]
# ## What to take away
#
# * Local SGD trades rounds for drift: H = 4 made 4x fewer all-reduce rounds (counted) and ended within 2 points of
#   synchronous SGD at the same samples here (asserted); H = 8 halves the rounds again. Between averagings the
#   ranks hold different models; right after each one they hold the same parameters and momentum (asserted from
#   the fingerprints).
# * The rounds saved are worth most where a round is expensive (many ranks, slow links, latency-bound small
#   models); on a 2-core loopback they barely show in the time (this run's seconds are printed in §1).
# * Post-local SGD keeps the first steps synchronous, then goes local: the same rounds after the warm-up, and no
#   drift at all during it (asserted: its ranks were identical after each of the first 8 steps, where local H = 8's
#   were not). What that did to accuracy is printed beside it for this run, not claimed.
# * Asynchrony removes waiting but applies gradients computed on old parameters. Without damping, plain SGD at a
#   learning rate that is fine synchronously falls apart when gradients are late: at tau 32 it lost more than 20
#   points (asserted; every tau is in the table of §3).
# * Damping the learning rate by the staleness keeps it training: under uniform staleness, 1 / (1 + s) per
#   gradient recovered more than 20 points at tau 32 (asserted). Fresh gradients keep their full step with it,
#   where damping by the bound shrinks every step; with a fixed delay the two rules differ only in the first tau
#   updates. Damping slows learning, so it recovers much of the accuracy, not all of it (in this run: printed in
#   §3).
# * Delay compensation corrects the stale gradient instead of shrinking it: at the same staleness DC-ASGD ended
#   with a lower training loss than plain async SGD (§4, asserted at tau 8 and 16; accuracies printed there).
