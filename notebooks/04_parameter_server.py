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
# # 04 · 四、参数服务器 — Parameter server
#
# Before rings, data-parallel training synchronised through a **parameter server** (PS; Li et al., OSDI 2014):
# the parameters live on servers; every step each worker **pushes** its gradient, the server adds the pushes and
# **updates** the parameters with the optimizer (whose state lives only there), and every worker **pulls** the
# new parameters. With one server, its link carries W−1 gradients in and W−1 copies of the parameters out per step:
# it is the bottleneck, and it grows with the number of workers W. **Sharding** the parameters over k servers
# divides that load by k; with one shard per rank, the push is exactly a *reduce-scatter* and the pull an
# *all-gather*, which together are what a ring all-reduce does (notebook 05), with the same bytes per rank.
#
# hvdsync builds both from Horovod's collectives (`sync.mode: ps`, `hvdsync/torch/schemes/ps.py`):
#
# * `sync.ps_servers: 0` (every rank owns a shard): `hvd.alltoall` sends each owner its piece of every gradient and
#   the owner adds the W pieces (the push: a reduce-scatter), update at the owner, `hvd.allgather` to pull. Not
#   Horovod's own `hvd.reducescatter`, for reasons measured when the package was written and given in
#   `hvdsync.torch.schemes.ps.push` (this notebook does not measure them);
# * `sync.ps_servers: 1`: `hvd.alltoall` with splits `[S, 0, …]` sends every gradient to rank 0, rank 0 updates,
#   `hvd.broadcast` pulls.
#
# We check that both train to the ring's parameters, count the bytes through each rank, time the patterns, and
# use the numpy simulation and the cost model (`hvdsync.core.comm.schemes`, `hvdlab.costmodel`) for 4 to 64 ranks.

# %%
import matplotlib.pyplot as plt
import numpy as np

from hvdsync import launch
from hvdsync.config import Config
from hvdlab import costmodel
from hvdsync.core.train.data import digits
from hvdlab import sim
from hvdlab.torch.measure import collective_times
from hvdlab.torch.modes import train_modes

cfg = Config().replace(train={"np": 2, "epochs": 3, "seed": 1}, data={"batch_size": 32},
                       tracking={"enabled": False})
MODES = {"ring all-reduce": {}, "sharded PS": {"mode": "ps"}, "single-server PS": {"mode": "ps", "ps_servers": 1}}

# %% [markdown]
# ## 1 · Same training, three ways
#
# One pair of workers trains the same MLP from the same start three times (SGD with momentum 0.9; at the owner the
# optimizer is a new one of the same class and settings over its shard). The parameters must agree to float
# rounding: only the order of the additions differs.

# %%
runs = launch.run(train_modes, args=(cfg.to_dict(), MODES), np=2, sync=cfg.sync, progress=False)
ring = runs[0]["ring all-reduce"]
for name, r in runs[0].items():
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(r["params"], ring["params"]))
    print(f"{name:17}: test accuracy {r['accuracy']:.4f}, {r['steps']} steps in {r['seconds']:.1f} s, "
          f"max |parameter - ring's| = {diff:.1e}, ranks equal: {r['spread'] == 0.0}")
    assert diff < 1e-5 and r["spread"] == 0.0

# %% [markdown]
# ## 2 · Bytes through each rank, counted
#
# Each scheme optimizer counts what it sends and receives from the splits and tensors it hands to Horovod (a
# message to oneself is free). The all-reduce path counts what it hands to Horovod (S per step, the gradient); its
# link bytes follow the ring law 2(W−1)/W·S, checked message by message in notebook 05.

# %%
steps = ring["steps"]
S = ring["wire"]["bytes"] / steps
print(f"gradient S = {S / 1e3:.1f} kB per step, {steps} steps, W = 2")
for rank, per in enumerate(runs):
    for name in ("sharded PS", "single-server PS"):
        t = per[name]["traffic"]
        print(f"rank {rank} {name:17}: sent {t['sent'] / steps / S:.2f} S, received {t['received'] / steps / S:.2f} S "
              "per step")
single = [per["single-server PS"]["traffic"] for per in runs]
assert single[0]["received"] == single[0]["sent"] == (2 - 1) * S * steps      # the server: W-1 gradients in

# %% [markdown]
# With W = 2 the server's load, (W−1)·S each way, equals any rank's in the ring, 2(W−1)/W·S = S. The numpy
# simulation counts the same way for more ranks: the server's link grows like W, a ring or sharded rank's stays
# below 2S, and all three reach the same parameters.

# %%
data = digits()
for world in (4, 8):
    steps_w = len(data.x_train) // (world * 16)
    a = sim.simulate("allreduce", data, world, steps_w)
    for servers in (1, 0):
        p = sim.simulate("ps", data, world, steps_w, servers=servers)
        diff = float(np.max(np.abs(p.params[0] - a.params[0])))
        print(f"W={world}, {'one server' if servers == 1 else 'sharded   '}: rank 0 sent {p.traffic.sent[0] / a.traffic.sent[0]:.2f}x "
              f"a ring rank's bytes, other ranks {p.traffic.sent[1] / a.traffic.sent[1]:.2f}x; parameters vs ring {diff:.1e}")
        assert diff < 1e-10
worlds = np.array([2, 4, 8, 16, 32, 64])
# A figure is made and shown in one cell: the inline backend shows and closes it at the end of the cell.
fig, a1 = plt.subplots(figsize=(6, 3.6))
for pattern, label in (("ps", "single server (rank 0)"), ("sharded_ps", "sharded PS (any rank)"),
                       ("ring", "ring (any rank)")):
    a1.plot(worlds, [costmodel.busiest_rank_bytes(pattern, 1.0, int(w)) for w in worlds], "o-", label=label)
a1.set_xscale("log", base=2), a1.set_xlabel("workers W"), a1.set_ylabel("bytes sent per step (multiples of S)")
a1.set_title("busiest rank's traffic"), a1.legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 3 · Time: the patterns measured, and the model's ranking
#
# `collective_times` times one round of each pattern through Horovod (a warm-up round, then 5 rounds that visit
# every size and pattern in turn; each timing the slowest rank's) for 4 and 16 MiB, and one 4-byte all-reduce: the
# fixed cost of a Horovod call (its negotiation), paid once per call whatever the size. The model as Horovod runs
# the patterns (`costmodel.horovod_time`: one call for the ring, two for the sharded PS, Gloo's tree broadcast for
# the single server), with that call cost and alpha, beta fitted to the ring on the same run, predicts the others.

# %%
SIZES = [4 * 2**20, 16 * 2**20]
per_rank = launch.run(collective_times, args=(SIZES, 5, ("ring", "sharded_ps", "ps", "call")), np=2, sync=cfg.sync,
                      progress=False)
med = {p: [float(np.median(per_rank[0]["times"][p][s])) for s in SIZES] for p in ("ring", "sharded_ps", "ps")}
call = float(np.median([t for s in SIZES for t in per_rank[0]["times"]["call"][s]]))
link = costmodel.fit_link(SIZES, med["ring"], 2, call=call)
print(f"one Horovod call: {call * 1e3:.2f} ms")
for p in med:
    print(f"{p:10}: " + ", ".join(f"{s / 2**20:.0f} MiB {t * 1e3:.1f} ms (model x{costmodel.horovod_time(p, s, 2, link) / t:.2f})"
                                  for s, t in zip(SIZES, med[p])))
assert all(all(r["correct"].values()) for r in per_rank)
x = np.arange(len(SIZES))
fig, a2 = plt.subplots(figsize=(6, 3.6))
for i, p in enumerate(med):
    a2.bar(x + 0.27 * (i - 1), np.array(med[p]) * 1e3, 0.27, label=p)
a2.set_xticks(x, [f"{s / 2**20:.0f} MiB" for s in SIZES]), a2.set_ylabel("ms (median)")
a2.set_title("one synchronisation, 2 workers, measured"), a2.legend()
plt.tight_layout()
plt.show()
for w in (8, 64):
    print(f"model, 100 MB on {w} ranks with this machine's fitted link: ring "
          f"{costmodel.horovod_time('ring', 1e8, w, link):.2f} s, sharded PS "
          f"{costmodel.horovod_time('sharded_ps', 1e8, w, link):.2f} s, one server {costmodel.horovod_time('ps', 1e8, w, link):.2f} s")

# %% [markdown]
# ## What to take away
#
# * A parameter server is push (gradients to the owners), update at the owner, pull (parameters back). Built from
#   Horovod's `alltoall` (plus a local sum at the owner) and `allgather`/`broadcast`, it reaches the ring's
#   parameters to float rounding, and keeps the optimizer state only at the owner.
# * One server receives W−1 gradients and sends W−1 copies per step: its link is the bottleneck and grows with W
#   (counted above: W/2 times a ring rank's traffic, (W−1)·S in each direction against the S a ring rank hands to
#   its all-reduce).
# * Sharding over every rank removes the bottleneck: reduce-scatter + all-gather *is* the ring all-reduce, the same
#   bytes per rank. Run through Horovod it is two calls where the ring is one, so the model gives it the ring's
#   time plus one call's negotiation.
# * With W = 2 the single server moves the same bytes as a ring rank and the difference is its extra step; at
#   4 workers (`python benchmarks/costmodel.py --np 4`) rank 0 of one server receives 3 whole buffers, and the
#   model says how it grows.
