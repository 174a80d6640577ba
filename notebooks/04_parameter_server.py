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
# # 04 · 四、掌握参数服务器的经典同步范式 — Mastering the classic synchronous paradigm of the parameter server
#
# > **The guide's section, point by point** (its own points in its order, translated; after each arrow: where this
# > notebook shows it with running code, or why it cannot here):
# >
# > 1. One or more central servers store and update the global parameters; many workers read the parameters, compute
# >    gradients and upload them. → §1: `sync.mode: ps`, sharded and single-server, trained against the ring on 2
# >    workers (same parameters).
# > 2. Synchronisation happens after the workers push their gradients: the server waits for all of them (or a set
# >    number), aggregates, updates the parameters and sends them back to every worker. → §2: one push/update/pull
# >    round written inline and equal to the package's; waiting for only some workers: notebook 08 §4 (backup
# >    workers).
# > 3. Its strengths: clear logic, and fault tolerance that is comparatively easy to build. → §4: with threads, an
# >    asynchronous server keeps going when a worker is lost, a synchronous step stops.
# > 4. Its weakness: the central server can become the communication bottleneck. → §2: bytes per rank counted on 2
# >    workers and, in a numpy simulation, at 4 and 8 ranks (the server's rank against a ring rank: counted there); §3
# >    the patterns timed.
# > 5. Ways to improve it: hierarchical parameter servers, and asynchronous updates to cut waiting. → §4: what a two-
# >    level server saves (counted); asynchronous updates: §4 here and notebook 13.
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
SIZES = [4 * 2**20, 16 * 2**20]   # section 3's buffer sizes (timed in section 1's job)

# %% [markdown]
# ## 1 · Same training, three ways
#
# One pair of workers trains the same MLP from the same start three times (SGD with momentum 0.9; at the owner the
# optimizer is a new one of the same class and settings over its shard). The parameters must agree to float
# rounding: only the order of the additions differs. The same job then times section 3's patterns (one Horovod
# start-up for both).

# %%
def train_then_time(cfg_dict, modes, sizes):
    return train_modes(cfg_dict, modes), collective_times(sizes, 5, ("ring", "sharded_ps", "ps", "call"))


both = launch.run(train_then_time, args=(cfg.to_dict(), MODES, SIZES), np=2, sync=cfg.sync, progress=False)
runs = [trained for trained, _ in both]        # per rank: section 1's trainings
per_rank = [timed for _, timed in both]        # per rank: section 3's timings
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
# ### One round, written out
#
# The whole mechanism fits in a few lines of numpy: cut the flat parameters into k shards (rank j owns shard j),
# every rank **pushes** its piece of each shard to the owner, the owner adds the pieces and **updates** its shard
# (plain SGD here; the optimizer's state would live only at the owner), and every rank **pulls** the updated
# shards. Bytes are counted per message; a message to oneself is free. The package's numpy round
# (`ps.ps_round`, the one hvdsync's simulation uses) must give the same parameters and the same bytes.

# %%
from hvdsync.core.comm.schemes import ps


def push_update_pull(grads, params, servers, lr):
    world = len(grads)
    sent, received = np.zeros(world, dtype=np.int64), np.zeros(world, dtype=np.int64)
    new = params.copy()
    for owner, idx in enumerate(np.array_split(np.arange(params.size), servers or world)):
        pushed = np.sum([g[idx] for g in grads], axis=0)     # push: every rank's piece of this shard
        new[idx] = params[idx] - lr * pushed / world          # update at the owner (op average)
        piece = idx.size * params.itemsize
        for r in range(world):
            if r != owner:
                sent[r] += piece                              # push: r -> owner
                received[owner] += piece
                sent[owner] += piece                          # pull: owner -> r
                received[r] += piece
    return [new.copy() for _ in range(world)], sent, received


rng = np.random.default_rng(0)
for world, servers in ((2, 0), (4, 1), (4, 0), (8, 2), (8, 0)):
    params, grads = rng.normal(size=1001), [rng.normal(size=1001) for _ in range(world)]
    mine, sent, received = push_update_pull(grads, params, servers, lr=0.1)
    theirs, traffic = ps.ps_round(grads, params, servers, lambda _server, p, g: p - 0.1 * g)
    assert all(np.array_equal(a, b) for a, b in zip(mine, theirs))
    assert sent.tolist() == traffic.sent.tolist() and received.tolist() == traffic.received.tolist()
    print(f"W={world}, {servers or world} server(s): same parameters and bytes as ps.ps_round; rank 0 sent "
          f"{sent[0] / params.nbytes:.2f} S, rank 1 sent {sent[1] / params.nbytes:.2f} S")

# %% [markdown]
# With W = 2 the server's load, (W−1)·S each way, equals any rank's in the ring, 2(W−1)/W·S = S. The numpy
# simulation counts the same way for more ranks, and checks that all three reach the same parameters.
#
# **Predict, then run.** With W = 8 ranks, how many times the bytes a ring rank sends per step will rank 0 send, as
# the one server, and as one owner of a sharded PS? Write your guess in the next cell (a dict of two ratios), then
# run the one after it.

# %%
my_prediction = None   # your guess, e.g. {"one server": 2.0, "sharded": 0.5}

# %%
data = digits()
sent_ratio = {}    # (W, servers): rank 0's bytes sent over a ring rank's
for world in (4, 8):
    steps_w = len(data.x_train) // (world * 16)
    a = sim.simulate("allreduce", data, world, steps_w)
    for servers in (1, 0):
        p = sim.simulate("ps", data, world, steps_w, servers=servers)
        diff = float(np.max(np.abs(p.params[0] - a.params[0])))
        print(f"W={world}, {'one server' if servers == 1 else 'sharded   '}: rank 0 sent {p.traffic.sent[0] / a.traffic.sent[0]:.2f}x "
              f"a ring rank's bytes, other ranks {p.traffic.sent[1] / a.traffic.sent[1]:.2f}x; parameters vs ring {diff:.1e}")
        assert diff < 1e-10
        ratio = p.traffic.sent[0] / a.traffic.sent[0]
        sent_ratio[world, servers] = ratio
        if servers == 1:   # the server sends W-1 copies where a ring rank sends 2(W-1)/W of one: W/2 times more
            assert abs(ratio - world / 2) < 0.01 and p.traffic.received[0] == (world - 1) * p.params[0].nbytes * steps_w
        else:
            assert abs(ratio - 1) < 0.01
measured = f"one server {sent_ratio[8, 1]:.2f}x, sharded {sent_ratio[8, 0]:.2f}x a ring rank's bytes (W = 8)"
print(f"your prediction: {my_prediction}; measured: {measured}" if my_prediction is not None else
      f"measured: {measured} (write a prediction above and run again to compare)")
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
# `collective_times` (in section 1's job, after the trainings) timed one round of each pattern through Horovod (a
# warm-up round, then 5 rounds that visit every size and pattern in turn; each timing the slowest rank's) for 4 and
# 16 MiB, and one 4-byte all-reduce: the fixed cost of a Horovod call (its negotiation), paid once per call whatever
# the size. The model as Horovod runs
# the patterns (`costmodel.horovod_time`: one call for the ring, two for the sharded PS, Gloo's tree broadcast for
# the single server), with that call cost and alpha, beta fitted to the ring on the same run, gives a time for
# the others; the cell prints the model's time over the measured one for each (in this run's numbers, not
# asserted: other jobs on the same cores move single timings).

# %%
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
# ## 4 · Hierarchical servers, and what a lost worker costs
#
# **Hierarchical servers.** On W workers spread over M machines, a flat single server receives a gradient from
# every worker on the other machines over the network. A two-level server first adds the gradients of each
# machine's workers on that machine (fast local links), then sends one sum per machine to the global server, and
# the updated parameters come back the same way. The sum is the same; what crosses machines is counted below,
# message by message, for the server machine's network link (push direction; the pull is symmetric).

# %%
def two_level_round(grads, params, machines, lr):
    per = len(grads) // machines
    local = [np.sum(grads[m * per:(m + 1) * per], axis=0) for m in range(machines)]   # level 1, inside a machine
    crossing = {"flat": sum(params.nbytes for r in range(len(grads)) if r // per != 0),
                "two-level": sum(params.nbytes for m in range(machines) if m != 0)}
    return params - lr * np.sum(local, axis=0) / len(grads), crossing                   # level 2, the global server


print("  W | machines | bytes into the server machine per step, flat / two-level (multiples of S)")
for world, machines in ((8, 2), (32, 4), (64, 8)):
    params, grads = rng.normal(size=1000), [rng.normal(size=1000) for _ in range(world)]
    new, crossing = two_level_round(grads, params, machines, lr=0.1)
    flat = ps.ps_round(grads, params, 1, lambda _server, p, g: p - 0.1 * g)[0][0]
    assert np.allclose(new, flat, rtol=0, atol=1e-12), "the same update, only added in a different order"
    flat_s, two_s = crossing["flat"] / params.nbytes, crossing["two-level"] / params.nbytes
    assert two_s == machines - 1 < flat_s == world - world // machines, "M-1 machine sums instead of W-W/M gradients"
    print(f"{world:>3} | {machines:>8} | {flat_s:>5.0f} / {two_s:.0f}")

# %% [markdown]
# **A lost worker.** In an asynchronous PS every worker pushes and pulls on its own schedule, so the server keeps
# applying the others' gradients when one worker disappears. In a synchronous step the server (or an all-reduce)
# needs every worker's gradient, so the step cannot complete: the others wait until a timeout says the worker is
# gone. Below, 4 worker threads in this process push to one server object (a lock around the update) for 40
# steps, 2 ms of "compute" each; worker 1 stops for good after 10 pushes, with no error. The synchronous variant
# waits for all four at a barrier with a 0.5 s timeout before each update. This is a model of the two protocols in
# threads, not a Horovod job: hvdsync's `sync.mode: ps` is built from Horovod's collectives and is synchronous, so
# it stops like the second case (notebook 10 shows how an elastic job recovers).

# %%
import threading
import time


def server_with_a_lost_worker(synchronous, world=4, steps=40, lost_after=10, compute_s=0.002, timeout_s=0.5):
    lock, barrier = threading.Lock(), threading.Barrier(world, timeout=timeout_s)
    applied, params, stalled = [0] * world, np.zeros(8), []

    def worker(r):
        for step in range(steps):
            if r == 1 and step == lost_after:
                return                                     # lost: no error, just no more pushes
            time.sleep(compute_s)                          # computing a gradient
            if synchronous:
                t0 = time.perf_counter()
                try:
                    barrier.wait()                         # the step needs every worker's gradient
                except threading.BrokenBarrierError:
                    stalled.append(time.perf_counter() - t0)
                    return
            with lock:                                     # the server applies this worker's push
                params[:] -= 0.01 * np.ones(8)
                applied[r] += 1

    threads = [threading.Thread(target=worker, args=(r,)) for r in range(world)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return applied, time.perf_counter() - start, stalled


lost = {name: server_with_a_lost_worker(name == "synchronous") for name in ("asynchronous", "synchronous")}
for name, (applied, seconds, stalled) in lost.items():
    print(f"{name:>12}: pushes applied per worker {applied}, {seconds:.2f} s"
          + (f", the others stalled {np.mean(stalled):.2f} s before the timeout gave up" if stalled else ""))
assert lost["asynchronous"][0] == [40, 10, 40, 40], "async: the other workers finish all their steps"
assert lost["synchronous"][0] == [10, 10, 10, 10], "sync: nobody gets past the step the lost worker never joins"
# The first waiter to time out waited the full 0.5 s; the others had arrived a little later at the barrier.
assert max(lost["synchronous"][2]) >= 0.5 and min(lost["synchronous"][2]) > 0.4, "stuck until the timeout"

fig, ax = plt.subplots(figsize=(6, 3))
for i, (name, (applied, *_)) in enumerate(lost.items()):
    ax.bar(np.arange(4) + 0.4 * (i - 0.5), applied, 0.4, label=name)
ax.set_xticks(range(4), [f"worker {r}" + (" (lost)" if r == 1 else "") for r in range(4)])
ax.set_ylabel("pushes applied (of 40)"), ax.legend(fontsize=8)
ax.set_title("Worker 1 lost after 10 pushes")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## What to take away
#
# * A parameter server is push (gradients to the owners), update at the owner, pull (parameters back). Built from
#   Horovod's `alltoall` (plus a local sum at the owner) and `allgather`/`broadcast`, it reaches the ring's
#   parameters to float rounding, and keeps the optimizer state only at the owner.
# * One server receives W−1 gradients and sends W−1 copies per step: its link is the bottleneck and grows with W
#   (counted and asserted above: W/2 times a ring rank's traffic, (W−1)·S in each direction against the S a ring
#   rank hands to its all-reduce).
# * Sharding over every rank removes the bottleneck: reduce-scatter + all-gather *is* the ring all-reduce, the same
#   bytes per rank. Run through Horovod it is two calls where the ring is one, so the model gives it the ring's
#   time plus one call's negotiation.
# * With W = 2 the single server moves the same bytes as a ring rank (asserted in section 2); at 4 workers the
#   simulation counts (W−1)·S = 3 whole buffers into rank 0 of one server per step (asserted), and the model says
#   how it grows.
# * A two-level server adds each machine's gradients locally and sends one sum per machine: the server machine's
#   link carries M−1 instead of W−W/M gradients per step (counted in section 4, with the same update).
# * An asynchronous server keeps applying the other workers' pushes when one is lost; a synchronous step stops
#   until a timeout notices (section 4, asserted on a thread model). hvdsync's `sync.mode: ps` is synchronous.
