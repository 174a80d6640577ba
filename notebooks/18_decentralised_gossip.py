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
# # 18 · 十八、最新进展：去中心化与 Gossip 平均 — Recent progress: decentralised and gossip averaging
#
# A ring all-reduce makes every rank wait for every other rank every step. **Decentralised** training drops the
# global agreement: each rank keeps its own parameters and, every H steps, averages them only with its
# **neighbours** on a communication graph, here a ring (D-PSGD: Lian et al., NeurIPS 2017):
#
# `x_r ← Σ_j W[r, j] · x_j  (j ∈ {r−1, r, r+1}),   then   x_r ← x_r − lr · ∇f_r(x_r)`
#
# W is the Metropolis matrix of the ring (`hvdsync.core.comm.schemes.gossip.mixing_matrix`): doubly stochastic, so the
# ranks' *mean* follows plain SGD while their spread around it, the **consensus distance** (Kong et al., ICML 2021),
# shrinks at every mixing and grows again with every local step. Each rank sends its parameters to 2 neighbours
# whatever the world size: the bytes per rank are constant in W. The price: the ranks agree only approximately,
# and a long ring mixes slowly.
#
# hvdsync runs it for real (`sync.mode: gossip`, `sync.period: H`) with `hvd.alltoall` to the neighbours
# (`hvdsync/torch/schemes/gossip.py`). With W = 2 both neighbours are the same rank and one mixing is an exact average,
# so 4, 8 and 16 ranks come from the numpy simulation of the same algorithm (`hvdlab.sim`), whose
# one round is checked against the Horovod one at W = 2 in the test suite.

# %%
import matplotlib.pyplot as plt
import numpy as np

from hvdsync import launch
from hvdsync.config import Config
from hvdlab import costmodel
from hvdsync.core.train.data import digits
from hvdlab import sim
from hvdsync.core.comm.schemes import gossip
from hvdlab.torch.modes import train_modes

cfg = Config().replace(train={"np": 2, "epochs": 4, "seed": 2}, data={"batch_size": 32},
                       tracking={"enabled": False})
MODES = {"all-reduce": {}, "gossip H=1": {"mode": "gossip"}, "gossip H=4": {"mode": "gossip", "period": 4}}

# %% [markdown]
# ## 1 · Two real workers: accuracy and consensus
#
# The same MLP from the same start, trained with all-reduce and with gossip every step and every 4 steps, for the
# same epochs. For gossip the optimizer also records the consensus distance just before and just after every
# mixing (two extra all-reduces, for the measurement only).

# %%
runs = launch.run(train_modes, args=(cfg.to_dict(), MODES), np=2, sync=cfg.sync, progress=False)[0]
for name, r in runs.items():
    extra = ""
    if r["traffic"]:
        extra = f", {r['traffic']['rounds']} mixings, {r['traffic']['sent'] / 1e6:.2f} MB sent by rank 0"
    print(f"{name:11}: test accuracy per epoch {', '.join(f'{a:.3f}' for a in r['history'])}{extra}")
gap = {n: abs(runs[n]["accuracy"] - runs["all-reduce"]["accuracy"]) for n in ("gossip H=1", "gossip H=4")}
print("accuracy gap to all-reduce after the same epochs: " + ", ".join(f"{n} {g * 100:.1f} points" for n, g in gap.items()))
assert max(gap.values()) <= 0.02
for name in ("gossip H=1", "gossip H=4"):
    assert all(after < before for _, before, after in runs[name]["consensus"][1:])

# A figure is made and shown in one cell: the inline backend shows and closes it at the end of the cell.
fig, a1 = plt.subplots(figsize=(6, 3.6))
for name, marker in (("gossip H=1", "."), ("gossip H=4", "o")):
    rec = np.array(runs[name]["consensus"][1:])
    a1.plot(rec[:, 0], rec[:, 1], marker, ms=3, label=f"{name}: before mixing")
    a1.plot(rec[:, 0], np.maximum(rec[:, 2], 1e-9), marker, ms=3, label=f"{name}: after (exact average at W=2)")
a1.set_yscale("log"), a1.set_xlabel("step"), a1.set_ylabel("consensus distance"), a1.legend(fontsize=7)
a1.set_title("2 Horovod workers")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 2 · More ranks, simulated: ranks that start apart are pulled together
#
# The simulation gives every rank its own noisy start (spread 0.5) so the pull towards consensus is visible, then
# runs gossip (H = 1) on digits with a softmax model, for 4, 8 and 16 ranks, against all-reduce at the same steps.
# A bigger ring mixes more slowly: the second eigenvalue of W (`gossip.contraction`) tends to 1.

# %%
data = digits()
fig, a2 = plt.subplots(figsize=(6, 3.6))
for world in (4, 8, 16):
    steps = 4 * (len(data.x_train) // (world * 16))
    g = sim.simulate("gossip", data, world, steps, init_spread=0.5)
    a = sim.simulate("allreduce", data, world, steps)
    print(f"W={world:2}: contraction {gossip.contraction(world):.3f}; consensus {g.consensus[0]:.2f} -> "
          f"{g.consensus[-1]:.3f}; accuracy gossip {np.mean(g.accuracy):.3f} vs all-reduce {a.accuracy[0]:.3f}")
    assert g.consensus[-1] < g.consensus[0] / (5 if world <= 8 else 2)   # a 16-ring mixes slowly
    a2.plot(g.consensus, label=f"W={world}")
a2.set_yscale("log"), a2.set_xlabel("step"), a2.set_ylabel("consensus distance"), a2.legend()
a2.set_title("numpy simulation, ranks starting apart")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 3 · Bytes per rank as the world grows
#
# Counted by the simulation's round (`gossip.traffic`, `ps.traffic`) and given by the cost model: a gossip rank sends
# 2·S per mixing whatever W is; a ring rank sends 2(W−1)/W·S (also bounded, but it needs 2(W−1) sequential steps
# every time, so its latency term grows with W); a single server sends (W−1)·S.

# %%
worlds = [2, 4, 8, 16, 32, 64, 128]
S = 1.0
fig, (b1, b2) = plt.subplots(1, 2, figsize=(11, 3.4))
for pattern in ("gossip", "ring", "ps"):
    b1.plot(worlds, [costmodel.busiest_rank_bytes(pattern, S, w) for w in worlds], "o-", label=pattern)
link = costmodel.Link(alpha=50e-6, beta=1 / 12.5e9, name="100 GbE")
for pattern in ("gossip", "ring", "ps"):
    b2.plot(worlds, [costmodel.predict(pattern, 1e6, w, link) * 1e3 for w in worlds], "o-", label=pattern)
b1.set_xscale("log", base=2), b1.set_yscale("log"), b1.set_xlabel("ranks W"), b1.set_ylabel("bytes sent (x S)")
b2.set_xscale("log", base=2), b2.set_yscale("log"), b2.set_xlabel("ranks W"), b2.set_ylabel("ms")
b1.set_title("busiest rank's bytes per synchronisation"), b1.legend()
b2.set_title("model: 1 MB on 100 GbE (alpha 50 us)"), b2.legend()
plt.tight_layout()
plt.show()
assert [gossip.traffic(1000, 4, w).sent[0] for w in (4, 8, 16, 64)] == [8000] * 4
print("gossip bytes per rank per mixing, W = 4, 8, 16, 64:", [int(gossip.traffic(1000, 4, w).sent[0]) for w in (4, 8, 16, 64)])

# %% [markdown]
# ## What to take away
#
# * Gossip replaces the global all-reduce by an exchange with two neighbours: the bytes and the number of messages
#   per rank stay constant as the world grows, and no rank waits for the slowest rank of the whole job.
# * The ranks no longer hold the same model; every mixing shrinks their consensus distance, local steps grow it.
#   Mixing every step (H = 1) or every few steps keeps it small enough that accuracy stays close to all-reduce
#   (measured above after the same epochs).
# * Large rings mix slowly (the contraction tends to 1): more steps, better graphs (exponential, random
#   neighbours), or an occasional global average are the known remedies.
# * With only 2 workers gossip *is* an exact average: the interesting regime needs more ranks, hence the
#   simulation checked against the real exchange.
