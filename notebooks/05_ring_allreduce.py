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
# # 05 · 五、精通基于集合通信的环同步算法 — Mastering the ring synchronisation algorithm built on collective communication
#
# > **The guide's section, point by point** (its own points in its order, translated; after each arrow: where this
# > notebook shows it with running code, or why it cannot here):
# >
# > 1. Collective communication, the all-reduce above all, is the foundation of synchronisation in high-performance
# >    computing today. → §3: Horovod's all-reduce on 2 workers from 64 KiB to 16 MiB, timed.
# > 2. In the ring algorithm all workers are joined, logically, into a ring. → §1: the ring step by step in numpy
# >    (`hvdlab.ring`).
# > 3. Gradients are aggregated not through a central node but passed along between neighbours: each node adds what it
# >    received to its own and hands it on to the next. → §1, checked against the plain sum for sizes the ring does
# >    not divide.
# > 4. After a number of rounds every node holds the whole sum. → §1 (2(n − 1) steps).
# > 5. It removes the central bottleneck and uses the links evenly, which pays most when there are many nodes. → §2:
# >    bytes per worker counted against 2(n − 1)/n · S and against a parameter server's n · S. §4 times a
# >    small all-reduce on 2, 3 and 4 real workers (on 2 cores); larger n are the numpy ring.
# > 6. The distributed back-ends of the main frameworks build such algorithms in. → §3 Horovod over Gloo; notebook 12a
# >    PyTorch DDP; NCCL needs GPUs.
#
# Every synchronous step ends with an **all-reduce**: each of the n workers holds a gradient of S bytes, and each
# must end up with the sum (or mean) of all n. The obvious design is a **parameter server**: every worker sends its
# gradient to one central node, which adds them and sends the sum back. Each worker then moves only 2S bytes, but
# the server receives n·S and sends n·S: its link carries traffic that grows with the number of workers, and the
# job slows down as it grows.
#
# The **ring all-reduce** (what Horovod runs; over Gloo it is `gloo::allreduce`, whose default algorithm is the
# ring) has no centre. The n ranks form a cycle; each cuts its buffer into n chunks and only ever talks to its
# right neighbour:
#
# 1. **reduce-scatter**, n − 1 steps: at step s rank r sends chunk r − s to rank r + 1, which *adds* it to its own.
#    Each chunk travels around the ring collecting one contribution per hop; at the end rank r holds the complete
#    sum of chunk r + 1.
# 2. **all-gather**, n − 1 steps: the finished chunks travel around the ring once more, each receiver
#    *overwriting* its copy, until every rank has every summed chunk.
#
# Each rank sends 2(n − 1) chunks of S/n bytes, **2(n − 1)/n · S** in all: less than 2S whatever n is, the same for
# every rank, and all links busy at once. This notebook runs the ring step by step in numpy
# (`hvdlab.ring`), checks it against the sum, counts its bytes against the law and against a parameter
# server, and then measures the real thing: Horovod all-reducing 64 KiB to 16 MiB on 2 workers.

# %%
import time

import matplotlib.pyplot as plt
import numpy as np

from hvdsync import launch
from hvdsync.config import Config
from hvdlab import ring

# %% [markdown]
# ## 1 · The ring, step by step
#
# Three ranks, six numbers each, two per chunk. Rank r holds 10^r × [1 … 6], so a digit of a partial sum shows
# which ranks have contributed to it: 11 is ranks 0 and 1, 111 is all three.

# %%
arrays = [10**r * np.arange(1, 7) for r in range(3)]
trace = ring.ring_allreduce(arrays, keep_states=True)
n = len(arrays)


def show_state(state, title):
    print(f"{title:<34}" + "  ".join(f"rank {r}: {state[r].tolist()}" for r in range(n)))


show_state(trace.states[0], "start")
for s, state in enumerate(trace.states[1:]):
    moves = trace.log[s * n:(s + 1) * n]
    print("   " + ", ".join(f"{t.src}→{t.dst} chunk {t.chunk}" for t in moves))
    show_state(state, f"after {moves[0].phase} step {moves[0].step}")
expected = np.sum(arrays, axis=0)
print("sum:", expected.tolist(), "| every rank has it:", all(np.array_equal(r, expected) for r in trace.results))
print("bytes sent per rank:", trace.bytes_sent.tolist(),
      f"= 2(n-1)/n · S = {ring.ring_bytes_per_rank(n, arrays[0].nbytes):.0f} (S = {arrays[0].nbytes} bytes)")

# %% [markdown]
# The same run with 4 ranks, drawn: each cell is one element on one rank, coloured by how many ranks' values it
# already contains. During reduce-scatter one chunk per rank fills up; after step 3 each rank owns one complete
# chunk (4 contributions); all-gather then copies the complete chunks around.

# %%
n4 = 4
trace4 = ring.ring_allreduce([np.full(8, 2**r, dtype=np.int64) for r in range(n4)], keep_states=True)
# Rank r holds 2^r, so the number of 1 bits in a partial sum is the number of ranks it contains.
contributions = [np.array([[bin(int(v)).count("1") for v in buf] for buf in state]) for state in trace4.states]
fig, axes = plt.subplots(1, len(contributions), figsize=(13, 2.3), sharey=True, layout="constrained")
for s, (ax, grid) in enumerate(zip(axes, contributions)):
    im = ax.imshow(grid, cmap="viridis", vmin=1, vmax=n4)
    ax.set_title("start" if s == 0 else ("RS " if s < n4 else "AG ") + str((s - 1) % (n4 - 1)), fontsize=9)
    ax.set_xticks(np.arange(0, 8, 2), [f"c{c}" for c in range(n4)], fontsize=7)
    ax.set_yticks(range(n4), [f"rank {r}" for r in range(n4)], fontsize=7)
fig.colorbar(im, ax=axes, label="ranks contained", shrink=0.8)
fig.suptitle("Ring all-reduce on 4 ranks: reduce-scatter (RS) then all-gather (AG)")
plt.show()

# %% [markdown]
# It is not enough that it works on nice sizes: gradients rarely divide evenly by n. Chunks then differ by one
# element (`numpy.array_split`'s rule), and with fewer elements than ranks some chunks are empty. Integer buffers
# make the comparison exact.

# %%
rng = np.random.default_rng(0)
cases = 0
for n_ranks in range(1, 10):
    for size in (1, 2, 7, 10, 64, 1001):
        bufs = [rng.integers(-1000, 1000, size=size) for _ in range(n_ranks)]
        result = ring.ring_allreduce(bufs)
        assert all(np.array_equal(r, np.sum(bufs, axis=0)) for r in result.results), (n_ranks, size)
        assert result.bytes_sent.sum() == 2 * (n_ranks - 1) * bufs[0].nbytes   # each chunk: n-1 hops per phase
        cases += 1
print(f"ring result == sum on every rank in all {cases} cases (1-9 ranks, sizes 1 to 1001)")

# %% [markdown]
# ## 2 · The traffic law: ring against parameter server
#
# Now a 1 MiB float32 gradient on 2 to 32 ranks, simulated both ways with every byte counted. The ring's per-rank
# traffic approaches 2S and stops there; the parameter server's own link carries n·S each way.

# %%
size_bytes = 2**20
grad = np.ones(size_bytes // 4, dtype=np.float32)
ranks = [2, 4, 8, 16, 32]
print("  n | ring: bytes sent per rank (counted / law) | server: bytes sent (counted / law) | worker sends")
ring_counted, ps_counted = [], []
for n_ranks in ranks:
    r = ring.ring_allreduce([grad] * n_ranks)
    p = ring.parameter_server_allreduce([grad] * n_ranks)
    law_ring, law_ps = ring.ring_bytes_per_rank(n_ranks, size_bytes), ring.parameter_server_bytes(n_ranks, size_bytes)
    assert r.bytes_sent.tolist() == [law_ring] * n_ranks and p.server_bytes_sent == law_ps.server_sent
    ring_counted.append(r.bytes_sent.max())
    ps_counted.append(p.server_bytes_sent)
    print(f"{n_ranks:>3} | {r.bytes_sent.max() / 2**20:>12.3f} MiB / {law_ring / 2**20:.3f} MiB"
          f"{'':>13}| {p.server_bytes_sent / 2**20:>8.1f} MiB / {law_ps.server_sent / 2**20:.1f} MiB"
          f"{'':>10}| {p.worker_bytes_sent[0] / 2**20:.1f} MiB")

# %%
ns = np.arange(2, 33)
fig, ax = plt.subplots(figsize=(7.5, 3.8))
ax.plot(ns, [ring.ring_bytes_per_rank(k, size_bytes) / 2**20 for k in ns], color="tab:blue",
        label="ring, each rank: 2(n−1)/n · S")
ax.plot(ranks, np.array(ring_counted) / 2**20, "o", color="tab:blue", label="ring, counted in the simulation")
ax.plot(ns, [ring.parameter_server_bytes(k, size_bytes).server_sent / 2**20 for k in ns], color="tab:red",
        label="parameter server's link: n · S")
ax.plot(ranks, np.array(ps_counted) / 2**20, "s", color="tab:red", label="server, counted in the simulation")
ax.axhline(2, color="grey", ls=":", lw=0.8, label="2S")
ax.set_yscale("log", base=2)
ax.set_xlabel("ranks n")
ax.set_ylabel("MiB sent per all-reduce (S = 1 MiB)")
ax.set_title("The busiest node's traffic: ring vs parameter server")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# The price of the ring is latency: 2(n − 1) sequential steps instead of 2, each with its own start-up cost. For
# large gradients bandwidth dominates and the ring wins; for many small tensors the start-ups add up — which is why
# Horovod *fuses* small gradients into one buffer before reducing them (`sync.fusion_threshold_mb`).
#
# ## 3 · The real thing: Horovod on 2 workers
#
# Each worker all-reduces float32 tensors of 64 KiB to 16 MiB: once to warm up (and check the sum is right), then
# 20 timed times, each after a barrier so both ranks start together. Other programs share these two cores, so
# single runs scatter; we report the median and the fastest run. From the time we compute the
# *algorithm bandwidth* S / t and the *bus bandwidth* 2(n − 1)/n · S / t (`ring.bus_bandwidth`), the bytes each
# rank really put on its link per second, which is comparable across n. With n = 2 each rank sends exactly S.

# %%
def time_allreduce(cfg_dict, sizes_bytes, repeats):
    import time

    import horovod.torch as hvd
    import torch

    import hvdsync.torch as ht
    from hvdsync.config import Config

    info = ht.init(Config.from_dict(cfg_dict))
    out = []
    for nbytes in sizes_bytes:
        x = torch.full((nbytes // 4,), float(info.rank + 1))
        name = f"notebook05.{nbytes}"
        total = hvd.allreduce(x, op=hvd.Sum, name=name)              # warm-up, and the sum checked
        correct = bool(torch.all(total == info.size * (info.size + 1) / 2))
        seconds = []
        for _ in range(repeats):
            hvd.barrier()
            start = time.perf_counter()
            hvd.allreduce(x, op=hvd.Sum, name=name)
            seconds.append(time.perf_counter() - start)
        out.append({"bytes": nbytes, "correct": correct, "seconds": seconds, "size": info.size})
    return out


cfg = Config().replace(train={"np": 2}, tracking={"enabled": False})
SIZES = [2**16, 2**20, 4 * 2**20, 16 * 2**20]
start = time.perf_counter()
per_rank = launch.run(time_allreduce, args=(cfg.to_dict(), SIZES, 20), np=cfg.train.np, sync=cfg.sync,
                      progress=False)
print(f"measured on 2 Horovod workers in {time.perf_counter() - start:.1f} s (start-up included)")

# %%
measured = per_rank[0]
assert all(m["correct"] for r in per_rank for m in r), "Horovod's all-reduce must return the sum"
print("   size   | median time | fastest  | algorithm bw | bus bw (median / fastest) | bytes each rank sent (law)")
medians, busbw, best_busbw = [], [], []
for m in measured:
    t, fastest = float(np.median(m["seconds"])), float(np.min(m["seconds"]))
    medians.append(t)
    busbw.append(ring.bus_bandwidth(m["bytes"], t, m["size"]))
    best_busbw.append(ring.bus_bandwidth(m["bytes"], fastest, m["size"]))
    print(f"{m['bytes'] / 2**20:>7.3f} MiB | {1e3 * t:>8.2f} ms | {1e3 * fastest:>5.2f} ms | "
          f"{m['bytes'] / t / 1e9:>7.3f} GB/s | {busbw[-1] / 1e9:>6.3f} / {best_busbw[-1] / 1e9:.3f} GB/s"
          f"{'':>6}| {ring.ring_bytes_per_rank(m['size'], m['bytes']) / 2**20:.3f} MiB")
# A line through (bytes on the link, time): its intercept is the fixed cost of one all-reduce, its slope 1/bandwidth.
slope, intercept = np.polyfit([ring.ring_bytes_per_rank(2, b) for b in SIZES], medians, 1)
print(f"fit t = a + bytes/bw: fixed cost a = {1e3 * intercept:.2f} ms, bandwidth bw = {1 / slope / 1e9:.2f} GB/s")
# The fit's intercept is fragile on shared cores (it can even come out negative); a direct reading of the fixed
# cost: how much of the 64 KiB time its bytes would take at the 16 MiB all-reduce's rate.
bytes_only = SIZES[0] / (SIZES[-1] / medians[-1])
print(f"in this run a 64 KiB all-reduce took {1e3 * medians[0]:.2f} ms; at the 16 MiB one's rate its bytes would take "
      f"{1e3 * bytes_only:.2f} ms, so {100 * (1 - bytes_only / medians[0]):.0f} % of it is fixed cost")
assert best_busbw[-1] > best_busbw[0], "a bigger message amortises the fixed cost: more bytes per second"

fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.5))
mib = np.array(SIZES) / 2**20
for r, rank_results in enumerate(per_rank):
    a1.scatter(np.repeat(mib, [len(m["seconds"]) for m in rank_results]),
               1e3 * np.concatenate([m["seconds"] for m in rank_results]), s=6, alpha=0.4, label=f"rank {r}, each run")
a1.plot(mib, 1e3 * np.array(medians), "k-o", label="median (rank 0)")
a1.set_xscale("log", base=2)
a1.set_yscale("log")
a1.set_xlabel("tensor size (MiB)")
a1.set_ylabel("all-reduce time (ms)")
a1.set_title("Horovod all-reduce, 2 workers (Gloo)")
a1.legend(fontsize=8)
a2.plot(mib, np.array(busbw) / 1e9, "o-", color="tab:green", label="median run")
a2.plot(mib, np.array(best_busbw) / 1e9, "^--", color="tab:olive", label="fastest run")
a2.set_xscale("log", base=2)
a2.set_xlabel("tensor size (MiB)")
a2.set_ylabel("bus bandwidth (GB/s)")
a2.set_title("Bandwidth grows as the fixed cost is amortised")
a2.legend(fontsize=8)
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 4 · More workers: every step of the ring pays a latency
#
# The ring takes 2(n − 1) steps whatever the size, and each step waits for a message from the neighbour. For a
# small tensor the bytes hardly matter and the steps do: the time should grow with n. The same 64 KiB all-reduce,
# 20 timed times, on 3 and then 4 workers (one job each), beside the 2-worker run above. Said plainly: this machine
# has 2 cores, so 3 and 4 workers also share cores with each other, which adds to the time as well; the per-step
# latency of a real cluster is not what this measures, only that more ranks in the ring cost more time.
#
# **Predict, then run.** Going from 2 to 4 workers, the ring's steps grow from 2 to 6 and each rank's bytes from
# 64 KiB to 96 KiB. How many times the 2 workers' median time will the 64 KiB all-reduce take on 4 workers? Write
# your guess in the next cell (a number), then run the one after it.

# %%
my_prediction = None   # your guess, e.g. 1.2

# %%
small = SIZES[0]
by_n = {2: np.array(measured[0]["seconds"])}
start = time.perf_counter()
for n in (3, 4):
    out = launch.run(time_allreduce, args=(cfg.replace(train={"np": n}).to_dict(), [small], 20), np=n,
                     sync=cfg.sync, progress=False)
    assert all(r[0]["correct"] and r[0]["size"] == n for r in out), "the sum is right on every rank"
    by_n[n] = np.array(out[0][0]["seconds"])
print(f"3 and 4 workers measured in {time.perf_counter() - start:.1f} s (start-up included)")
med = {n: float(np.median(s)) for n, s in by_n.items()}
for n, t in med.items():
    print(f"{n} workers: 64 KiB all-reduce, median {1e3 * t:.2f} ms of {len(by_n[n])}; the ring's 2(n − 1) = "
          f"{2 * (n - 1)} steps; each rank sends {ring.ring_bytes_per_rank(n, small) / 2**10:.0f} KiB")
print(f"in this run: 4 workers took {med[4] / med[2]:.1f}x the 2 workers' time, 3 workers {med[3] / med[2]:.1f}x "
      f"(the ring's steps grow 3x and 2x; the bytes per rank only 1.5x and 1.33x)")
print(f"your prediction: {my_prediction}; measured: {med[4] / med[2]:.2f}x" if my_prediction is not None else
      f"measured: {med[4] / med[2]:.2f}x (write a prediction above and run again to compare)")
assert med[4] > med[2], "more ranks in the ring: a small all-reduce takes longer"

fig, ax = plt.subplots(figsize=(6, 3.4))
for n, s in by_n.items():
    ax.scatter(np.full(len(s), n), 1e3 * s, s=8, alpha=0.4, color="tab:blue")
ax.plot(list(med), [1e3 * v for v in med.values()], "k-o", label="median")
ax.set_xticks(list(med))
ax.set(xlabel="workers (n)", ylabel="64 KiB all-reduce (ms)", title="Time against ring size (2 cores shared)")
ax.legend(fontsize=8)
plt.tight_layout()
plt.show()

# %% [markdown]
# ## What to take away
#
# * **A ring all-reduce is a reduce-scatter followed by an all-gather**: 2(n − 1) steps in which every rank sends
#   one chunk of S/n bytes to its right neighbour. The simulation above reproduced the exact sum on every rank for
#   any n and any size, including sizes n does not divide.
# * **Its traffic per rank is 2(n − 1)/n · S — bounded by 2S, equal for every rank.** A parameter server's link
#   instead carries n · S each way, so it becomes the bottleneck as the job grows; the ring keeps every link busy
#   and none overloaded. The counted bytes matched both laws exactly.
# * **Real all-reduces have a fixed cost and a bandwidth.** On 2 local Gloo workers the fixed cost (start-up,
#   Horovod's negotiation between the ranks) is most of a small all-reduce (in this run: the share printed under
#   the table), and the bus bandwidth of 16 MiB exceeds that of 64 KiB (asserted). Few large messages beat many small ones: this is why
#   Horovod fuses gradients into one buffer, and why sending fewer bytes (fp16 compression) or reducing less
#   often (gradient accumulation, notebook 06) pays.
# * **More ranks, more steps.** A small all-reduce on 4 workers took longer than on 2 (asserted in §4; this run's
#   ratios printed there). On this 2-core machine part of that is the workers sharing cores, so the ratio is not a
#   cluster's; the 2(n − 1) latencies are why libraries switch to trees or hierarchies for small messages.
