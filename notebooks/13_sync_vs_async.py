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
# # 13 · 十三、同步训练与异步训练 — Synchronous vs asynchronous training
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

# %% [markdown]
# H = 1 averages parameters and momentum after every step: for SGD with momentum that is the same arithmetic as
# averaging the gradients (both are linear), so it matches synchronous SGD, at twice the bytes (the momentum rides
# along). With H = 4 and 8 the rounds fall 4x and 8x; the bytes only 2x and 4x, since each round carries the
# momentum too. The time column is this shared 2-core machine's loopback,
# where an all-reduce of this small MLP costs little next to the Python step: it is measured, not a claim about a
# real network.

# %%
spread = {}
for name in ("local H=4", "local H=8", "post-local 8+H=8"):
    a, b = (np.array(r[name]["fingerprints"]) for r in (r0, r1))
    spread[name] = np.max(np.abs(a - b), axis=1)
    period, warmup = MODES[name]["period"], MODES[name].get("warmup_steps", 0)
    agree = [local_sgd.synchronous(t, warmup) or local_sgd.averages_after(t, period, warmup)
             for t in range(1, steps + 1)]
    assert all((spread[name][t] == 0) == agree[t] for t in range(steps))

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
# ## 2 · Asynchronous SGD: accuracy against staleness
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
# ## What to take away
#
# * Local SGD trades rounds for drift: H = 4 made 4x fewer all-reduce rounds (counted) and ended within 2 points of
#   synchronous SGD at the same samples here (the table above); H = 8 halves the rounds again. Between averagings
#   the ranks hold different models; right after each one they hold the same parameters and momentum.
# * The rounds saved are worth most where a round is expensive (many ranks, slow links, latency-bound small
#   models); on a 2-core loopback they barely show in the time.
# * Post-local SGD keeps the first steps synchronous, then goes local: the same rounds after the warm-up, with the
#   early drift avoided.
# * Asynchrony removes waiting but applies gradients computed on old parameters. Without damping, plain SGD at a
#   learning rate that is fine synchronously falls apart once gradients are a few updates late.
# * Damping the learning rate by the staleness keeps it training: per gradient, 1 / (1 + s) loses least when
#   staleness varies (uniform), since fresh gradients keep their full step; with a fixed delay the two rules are the
#   same. Damping slows learning, so it recovers much of the accuracy, not all of it.
