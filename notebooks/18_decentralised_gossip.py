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
# # 18 · 十八、持续跟进同步技术的最新进展 — Keeping up with the latest advances in synchronisation techniques
#
# > **The guide's section, point by point** (its own points in its order, translated; after each arrow: where this
# > notebook shows it with running code, or why it cannot here):
# >
# > 1. Distributed machine learning moves fast, and synchronisation techniques keep evolving. → framing.
# > 2. New hardware (faster interconnects, dedicated AI chips) changes what synchronisation costs. → cannot run here
# >    (no GPU or accelerator); notebook 03 §2 puts NVLink and InfiniBand figures into the cost model.
# > 3. New algorithms, such as decentralised averaging protocols, offer an alternative to central aggregation. → §1
# >    one gossip round by hand; §2 gossip against all-reduce on 2 real workers, and gossip on 4; §3 4-16 ranks
# >    simulated; §4 bytes per rank.
# > 4. New frameworks and libraries keep appearing to make synchronisation simpler. → §5: ZeRO/FSDP sharding, a real
# >    Adam optimizer's state measured and the arithmetic done.
# > 5. Follow the research (systems papers at the top machine-learning conferences) and the main open-source projects'
# >    releases, to keep bringing the newest effective techniques into practice. → a habit, not a measurement: the
# >    notebook cites the papers its methods come from (D-PSGD, consensus distance, ZeRO).
#
# A ring all-reduce makes every rank wait for every other rank every step. **Decentralised** training drops the
# global agreement: each rank keeps its own parameters and, every H steps, averages them only with its
# **neighbours** on a communication graph, here a ring (D-PSGD: Lian et al., NeurIPS 2017):
#
# `x_r ← Σ_j W[r, j] · x_j − lr · ∇f_r(x_r)   (j ∈ {r−1, r, r+1}; the gradient taken at the parameters before the mixing)`
#
# hvdsync's real workers (section 2) follow that order, Lian et al.'s: backward computes the gradient at the
# current parameters, then `optimizer.step()` mixes them with the neighbours' and applies that gradient to the mixed
# ones (`hvdsync/torch/schemes/gossip.py`). The numpy simulation of section 3 (`hvdlab.sim`) takes the other common
# order: it mixes first and takes the gradient at the mixed parameters, `x_r ← x_r − lr · ∇f_r(x_r)` after the
# mixing (the same mixing and the same traffic; the two differ by where the gradient is evaluated).
#
# W is the Metropolis matrix of the ring (`hvdsync.core.comm.schemes.gossip.mixing_matrix`): doubly stochastic, so the
# ranks' *mean* follows plain SGD while their spread around it, the **consensus distance** (Kong et al., ICML 2021),
# shrinks at every mixing and grows again with every local step. Each rank sends its parameters to 2 neighbours
# whatever the world size: the bytes per rank are constant in W. The price: the ranks agree only approximately,
# and a long ring mixes slowly.
#
# hvdsync runs it for real (`sync.mode: gossip`, `sync.period: H`) with `hvd.alltoall` to the neighbours
# (`hvdsync/torch/schemes/gossip.py`): each rank sends bytes to its two neighbours only, but `hvd.alltoall` is a
# **global** collective that every rank enters and Horovod negotiates among all of them, so as built here a mixing
# still waits for the slowest rank of the job, like an all-reduce. Gossip's other promise, that a rank waits only
# for its neighbours, needs point-to-point exchanges (or neighbour-only process sets) and is not shown here.
# With W = 2 both neighbours are the same rank and one mixing is an exact average, so section 2 also runs 4 real
# workers, and 8 and 16 ranks come from the numpy simulation of the same algorithm (`hvdlab.sim`), whose one round
# is checked against the Horovod one at W = 2 in the test suite.
#
# **What this notebook runs, and what it does not.** Of the guide's newer directions it runs one, decentralised
# averaging (gossip, sections 1-4: by hand, on real Horovod workers, simulated). Sharding the training state
# (ZeRO, FSDP, section 5) is shown only as a measured optimizer state and arithmetic: hvdsync does not shard
# optimizer state, parameters or gradients, and nothing here trains sharded. New hardware is not run either (no
# accelerator here; notebook 03 §2 uses vendors' figures).

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
# ## 1 · One gossip round, by hand
#
# Each rank keeps a weight for each ring neighbour (Metropolis: 1 / (1 + the larger of the two degrees)) and the
# rest for itself, and replaces its parameters by that weighted average. Written out for any world size, then
# compared with the package's `gossip.mix` and `gossip.consensus_distance` for 2 to 16 ranks.

# %%
def neighbours_by_hand(rank, world):
    return sorted({(rank - 1) % world, (rank + 1) % world} - {rank})


def mix_by_hand(params):
    world = len(params)
    mixed = []
    for r in range(world):
        weights = {j: 1 / (1 + max(len(neighbours_by_hand(r, world)), len(neighbours_by_hand(j, world))))
                   for j in neighbours_by_hand(r, world)}
        mine = 1 - sum(weights.values())           # what is left stays with the rank: rows sum to 1
        mixed.append(mine * params[r] + sum(w * params[j] for j, w in weights.items()))
    return mixed


def consensus_by_hand(params):
    x = np.stack(params)
    return float(np.sqrt(np.mean(np.sum((x - x.mean(axis=0)) ** 2, axis=1))))


rng = np.random.default_rng(0)
for world in (2, 3, 4, 8, 16):
    params = [rng.standard_normal(50) for _ in range(world)]
    by_hand, package = mix_by_hand(params), gossip.mix(params)
    worst = max(float(np.abs(a - b).max()) for a, b in zip(by_hand, package))
    before, after = consensus_by_hand(params), consensus_by_hand(by_hand)
    print(f"W={world:2}: by hand vs gossip.mix {worst:.1e}; consensus {before:.3f} -> {after:.3f} "
          f"(x{after / before:.3f}, bound {gossip.contraction(world):.3f}); mean kept to "
          f"{float(np.abs(np.mean(by_hand, axis=0) - np.mean(params, axis=0)).max()):.0e}")
    assert worst < 1e-12 and abs(before - gossip.consensus_distance(params)) < 1e-12
    assert after <= gossip.contraction(world) * before + 1e-12 and np.allclose(np.mean(by_hand, 0), np.mean(params, 0))

# %% [markdown]
# ## 2 · Two real workers: accuracy and consensus
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
# With 2 workers both neighbours are the same rank and a mixing is an exact average (distance 0 after it). On 4
# real workers each rank mixes with two different neighbours (Metropolis weights 1/3 each): a mixing shrinks the
# distance without closing it. Gossip every step, 1 epoch (the 4 workers share the 2 cores, so only the
# consensus is looked at here, not the time).
#
# **Predict, then run.** Between two mixings each rank takes an SGD step on its own samples, which pushes the ranks
# apart again. By what factor does one mixing multiply the consensus distance on the 4 real workers (after / before,
# the median over the epoch's mixings)? Write your guess in the next cell (a number), then run the one after it.

# %%
my_prediction = None   # your guess, e.g. 0.9

# %%
four = launch.run(train_modes, args=(cfg.replace(train={"np": 4, "epochs": 1}).to_dict(),
                                     {"gossip H=1": {"mode": "gossip"}}), np=4, sync=cfg.sync, progress=False)[0]
rec4 = np.array(four["gossip H=1"]["consensus"][1:])
shrink = rec4[:, 2] / rec4[:, 1]
print(f"4 workers, gossip every step: {len(rec4)} mixings; after / before a mixing: median {np.median(shrink):.2f}, "
      f"range {shrink.min():.2f}-{shrink.max():.2f}; test accuracy {four['gossip H=1']['accuracy']:.3f}")
assert (rec4[:, 2] < rec4[:, 1]).all(), "every mixing pulls the 4 ranks together"
assert (rec4[:, 2] > 0).all(), "on 4 ranks one mixing is not an exact average"
# On the ring of 4 every eigenvalue of the mixing matrix but the consensus one is +-1/3: each mixing multiplies the
# spread around the mean by exactly 1/3 in norm, which the real exchange shows.
lam = sorted(abs(np.linalg.eigvals(gossip.mixing_matrix(4))))[-2]
print(f"second largest |eigenvalue| of the 4-rank mixing matrix: {lam:.4f}")
assert np.allclose(shrink, lam, rtol=1e-2), "the measured contraction is the mixing matrix's"

fig, a1 = plt.subplots(figsize=(6, 3.4))
a1.plot(rec4[:, 0], rec4[:, 1], ".", ms=3, label="before mixing")
a1.plot(rec4[:, 0], rec4[:, 2], ".", ms=3, label="after mixing")
a1.set_yscale("log"), a1.set_xlabel("step"), a1.set_ylabel("consensus distance"), a1.legend(fontsize=7)
a1.set_title("4 Horovod workers, gossip every step")
plt.tight_layout()
plt.show()
print(f"your prediction: {my_prediction}; measured: {np.median(shrink):.3f}" if my_prediction is not None else
      f"measured: {np.median(shrink):.3f} (write a prediction above and run again to compare)")

# %% [markdown]
# ## 3 · More ranks, simulated: ranks that start apart are pulled together
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
    assert gossip.contraction(world) > gossip.contraction(world // 2)     # a longer ring mixes more slowly
    a2.plot(g.consensus, label=f"W={world}")
a2.set_yscale("log"), a2.set_xlabel("step"), a2.set_ylabel("consensus distance"), a2.legend()
a2.set_title("numpy simulation, ranks starting apart")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 4 · Bytes per rank as the world grows
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
# ## 5 · Beyond gossip: sharding the training state (ZeRO, FSDP)
#
# Data parallelism replicates the model, its gradients and the optimizer's state on every rank. Newer frameworks
# shard them instead: ZeRO (Rajbhandari et al., SC 2020; DeepSpeed) in three stages — optimizer state (1), plus
# gradients (2), plus parameters (3) — and PyTorch's FSDP, whose strategies map onto those stages: `FULL_SHARD`
# (its default) is stage 3, `SHARD_GRAD_OP` keeps the parameters whole between forward and backward like stage 2
# (the strategies are read from the installed torch below). The cell measures what a real
# `torch.optim.Adam` keeps per parameter, then does the memory **arithmetic** (not a measurement) for mixed-precision
# training: 2 bytes of 16-bit parameters, 2 of gradients, and K = 12 of fp32 master copy and Adam's two moments.

# %%
import torch

model = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
adam = torch.optim.Adam(model.parameters())
model(torch.randn(8, 64)).sum().backward()
adam.step()
n_params = sum(p.numel() for p in model.parameters())
state = sum(t.numel() * t.element_size() for st in adam.state.values() for t in st.values()
            if torch.is_tensor(t) and t.dim() > 0)                # the step counter is a scalar
from torch.distributed.fsdp import ShardingStrategy

print("FSDP's sharding strategies in this torch:", ", ".join(s.name for s in ShardingStrategy))
assert {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD"} <= {s.name for s in ShardingStrategy}
print(f"measured: Adam keeps {state / n_params:.1f} bytes per parameter (two fp32 moments) for {n_params:,} parameters")
assert state == 8 * n_params
K = state / n_params + 4                                          # + the fp32 master copy of mixed precision


def per_rank_bytes(psi, ranks, stage):
    """Bytes per rank for psi parameters: 16-bit params and grads (2 + 2) and K of optimizer state, sharded by stage."""
    params, grads, opt = 2 * psi, 2 * psi, K * psi
    return (params / (ranks if stage >= 3 else 1) + grads / (ranks if stage >= 2 else 1)
            + opt / (ranks if stage >= 1 else 1))


psi, ranks = 7.5e9, 64                                             # the ZeRO paper's example
gb = [per_rank_bytes(psi, ranks, stage) / 1e9 for stage in range(4)]
print("arithmetic, 7.5B parameters on 64 ranks, GB per rank: " + ", ".join(
    f"{name} {g:.1f}" for name, g in zip(("replicated", "ZeRO-1", "ZeRO-2", "ZeRO-3"), gb)))
assert [round(g, 1) for g in gb] == [120.0, 31.4, 16.6, 1.9]      # the paper's Figure 1
print("arithmetic, bytes sent per rank per step (x parameters): all-reduce 2 (reduce-scatter + all-gather); "
      "ZeRO-1/2 the same 2; ZeRO-3 3 (parameters all-gathered for forward and again for backward)")

fig, ax = plt.subplots(figsize=(7, 3.6))
for i, r in enumerate((8, 64, 1024)):
    ax.bar(np.arange(4) + 0.27 * (i - 1), [per_rank_bytes(psi, r, st) / 1e9 for st in range(4)], 0.27,
           label=f"{r} ranks")
ax.set_xticks(range(4), ["replicated", "ZeRO-1", "ZeRO-2", "ZeRO-3"])
ax.set(yscale="log", ylabel="GB per rank (arithmetic)", title="7.5B parameters, mixed-precision Adam")
ax.legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# ## What to take away
#
# * Gossip replaces the global all-reduce by an exchange with two neighbours (section 1, by hand and checked
#   against the package): the bytes per rank stay constant as the world grows (asserted in section 4). In the
#   literature a rank then waits only for its neighbours; hvdsync's gossip does not give that, because its
#   exchange is `hvd.alltoall`, a collective of every rank, which waits for the slowest one (not measured here).
# * The ranks no longer hold the same model; every mixing shrinks their consensus distance, local steps grow it.
#   Mixing every step (H = 1) or every few steps keeps it small enough that accuracy stays close to all-reduce
#   (within 2 points after the same epochs, asserted in section 2).
# * Large rings mix slowly (the contraction grows towards 1 with W, asserted in section 3): more steps, better
#   graphs (exponential, random neighbours), or an occasional global average are the known remedies.
# * With only 2 workers gossip *is* an exact average; on 4 real workers a mixing shrinks the consensus distance
#   without closing it: by the mixing matrix's second eigenvalue, 1/3, at every mixing (asserted in section 2).
#   Larger worlds come from the simulation, checked against the real exchange.
# * Recent frameworks shard what data parallelism replicates: the measured Adam state (8 bytes per parameter) plus
#   a master copy makes 16 bytes per parameter replicated; sharded over 64 ranks, ZeRO-3 / FSDP's `FULL_SHARD`
#   needs 1/64 of it (arithmetic, checked against the ZeRO paper's figures), for 1.5x the bytes of an all-reduce.
#   This is arithmetic only: hvdsync does not shard training state, and this notebook trains nothing sharded.
