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
# # 03 · 三、选择与配置同步训练的核心硬件架构 — Choosing and configuring the core hardware architecture for synchronous training
#
# > **The guide's section, point by point** (its own points in its order, translated; after each arrow: where this
# > notebook shows it with running code, or why it cannot here):
# >
# > 1. Hardware carries the synchronisation; the usual set-ups are one machine with several GPUs, several machines
# >    with several GPUs, and heterogeneous cloud clusters. → the first cells measure this one machine (cores,
# >    memory, loopback); there is no GPU, second machine or cloud here: §3 stands in with two test hosts (recorded
# >    run), §3c measures a heterogeneous pair in this run (one host behind a slower link: what it costs, what
# >    adaptive shares and fewer bytes do about it), and notebook 08 has workers of unequal speed.
# > 2. Within one machine the GPUs share a fast bus with very low latency, which suits tightly coupled synchronisation
# >    such as aggregating gradients through shared memory. → cannot run here (no GPU); §2 puts NVLink and PCIe
# >    figures for one 8-GPU node into the cost model (predictions); §3b reduces inside each test host before
# >    crossing the link (a hierarchical all-reduce, recorded: bytes and time against the flat ring).
# > 3. Across machines, network bandwidth and latency become the bottleneck, and collective libraries tuned for
# >    Ethernet or InfiniBand are needed. → §1 fits latency and bandwidth to Horovod's all-reduce measured here; §3
# >    two test hosts over a rate-limited link (recorded); §2 InfiniBand and Ethernet figures in the model; §4 NCCL
# >    against Gloo.
# > 4. The hardware sets the ceiling of what a synchronisation algorithm can do: where bandwidth is scarce, prefer
# >    strategies that communicate less often or send less. → §3: at the slowest rate the fp32 step is many times the
# >    unlimited one and fp16's half the bytes cut it (recorded, asserted); notebooks 06, 13 and 15 do the rest.
#
# A synchronous step waits for its all-reduce, and the all-reduce is only as fast as the links it runs over. The
# classic way to reason about it is the **alpha-beta(-gamma) model**: a message of m bytes costs `alpha + m·beta`
# (alpha: latency and software cost per message; beta: seconds per byte, 1/bandwidth), and adding a received buffer
# into one's own costs `m·gamma`. A ring all-reduce of S bytes on n ranks takes
#
# `T = 2(n−1)·alpha + 2(n−1)/n·S·beta + (n−1)/n·S·gamma`
#
# (`hvdlab.costmodel`; Thakur, Rabenseifner & Gropp 2005). For big buffers the beta term dominates and
# barely depends on n; for small ones the 2(n−1) latencies do, which is why libraries switch to trees for small
# messages and why Horovod *fuses* many small gradients into one buffer.
#
# This notebook measures what *this* machine has (cores, memory bandwidth, loopback latency and bandwidth), times
# Horovod's ring all-reduce on 2 workers from 1 to 64 MiB, **fits alpha and beta** and prints the model's
# prediction over the measurement. Then it puts vendors' figures for GPU-cluster fabrics (NVLink, PCIe,
# InfiniBand, Ethernet) into the same model, and explains why GPU clusters use NCCL rather than Gloo.

# %%
import time

import matplotlib.pyplot as plt
import numpy as np

from hvdsync import launch
from hvdsync.config import SyncConfig
from hvdlab import costmodel, hardware
from hvdlab.torch.measure import collective_times

MiB = 2**20
facts = hardware.describe()
mem = hardware.memory_bandwidth(128 * MiB)
lo = hardware.loopback(32 * MiB)
print(f"{facts['logical_cpus']} logical CPUs ({facts['usable_cpus']} usable), {facts['cpu_model']}, "
      f"{facts['memory_bytes'] / 2**30:.1f} GiB memory, {facts['system']}")
print(f"one core: copy {mem['copy_bytes_per_s'] / 1e9:.1f} GB/s, add a += b {mem['add_bytes_per_s'] / 1e9:.1f} GB/s "
      f"-> gamma = {mem['gamma'] * 1e12:.0f} ps per byte")
print(f"loopback TCP between two processes: latency {lo['latency_s'] * 1e6:.1f} us one way, "
      f"bandwidth {lo['bandwidth_bytes_per_s'] / 1e9:.2f} GB/s")

# %% [markdown]
# ## 1 · Horovod's all-reduce on this machine, and the fitted model
#
# Two workers over Gloo (TCP on the loopback interface, one thread each). Each size is all-reduced 5 times after a
# warm-up; each time is the slowest rank's, and we keep the **median** (the machine is shared: single runs
# scatter, and medians move by tens of percent between runs). The fit minimises the *relative* error, so 1 MiB
# counts as much as 64 MiB; gamma comes from the add throughput above.
#
# **Predict, then run.** A 64 MiB buffer holds 64 times the bytes of a 1 MiB one. How many times longer will
# Horovod's all-reduce of 64 MiB take than that of 1 MiB on these 2 workers (the ratio of the two medians)? Write
# your guess in the next cell (a number), then run the one after it.

# %%
my_prediction = None   # your guess, e.g. 10.0

# %%
SIZES = [1, 2, 4, 8, 16, 32, 64]
start = time.perf_counter()
per_rank = launch.run(collective_times, args=([s * MiB for s in SIZES], 5, ("ring",)), np=2, sync=SyncConfig(),
                      progress=False)
print(f"measured in {time.perf_counter() - start:.0f} s (worker start-up included)")
assert all(r["correct"]["ring"] for r in per_rank), "Horovod's all-reduce must return the sum"
times = per_rank[0]["times"]["ring"]
medians = np.array([np.median(times[s * MiB]) for s in SIZES])
link = costmodel.fit_link([s * MiB for s in SIZES], medians, 2, gamma=mem["gamma"], name="this machine")
ratios = costmodel.prediction_ratios(link, [s * MiB for s in SIZES], medians, 2)
print(f"fitted: alpha = {link.alpha * 1e6:.0f} us, beta = 1/({link.bandwidth / 1e9:.2f} GB/s), "
      f"gamma = 1/({1 / link.gamma / 1e9:.1f} GB/s)")
print("  size | median  | model   | model / measured")
for s, t, r in zip(SIZES, medians, ratios):
    print(f"{s:>3} MiB | {t * 1e3:6.1f} ms | {costmodel.predict('ring', s * MiB, 2, link) * 1e3:6.1f} ms | {r:.2f}")
print(f"ratios from {ratios.min():.2f} to {ratios.max():.2f} (target: within 0.67-1.5)")
growth = medians[-1] / medians[0]
print(f"your prediction: {my_prediction}; measured: {growth:.1f}x" if my_prediction is not None else
      f"measured: {growth:.1f}x (write a prediction above and run again to compare)")
assert link.beta > 0 and np.all(np.diff([costmodel.predict("ring", s * MiB, 2, link) for s in SIZES]) > 0)

# %%
fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 3.6))
for s in SIZES:
    a1.scatter([s] * len(times[s * MiB]), np.array(times[s * MiB]) * 1e3, s=8, color="tab:gray", alpha=0.5)
a1.plot(SIZES, medians * 1e3, "o-", label="measured (median)")
grid = np.geomspace(0.5, 80, 50)
a1.plot(grid, [costmodel.predict("ring", g * MiB, 2, link) * 1e3 for g in grid], "--", label="alpha-beta-gamma fit")
a1.set_xscale("log", base=2), a1.set_yscale("log")
a1.set_xlabel("buffer (MiB)"), a1.set_ylabel("all-reduce time (ms)"), a1.legend()
a1.set_title("Horovod ring all-reduce, 2 workers (Gloo, loopback)")
a2.bar([str(s) for s in SIZES], ratios, color=["tab:green" if 1 / 1.5 <= r <= 1.5 else "tab:red" for r in ratios])
a2.axhspan(1 / 1.5, 1.5, color="tab:green", alpha=0.1)
a2.axhline(1, color="k", lw=0.8)
a2.set_xlabel("buffer (MiB)"), a2.set_ylabel("predicted / measured"), a2.set_title("the model's error")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 2 · The same model on GPU-cluster fabrics
#
# Vendors' bandwidths **per direction**, which is what a ring step's send uses (NVIDIA H100/H200 datasheets: NVLink 4
# 900 GB/s per GPU, which counts both directions, so 450 GB/s each way; PCI-SIG: PCIe 4.0/5.0 x16 at ~32/64 GB/s per
# direction; NVIDIA ConnectX-7 user manual: InfiniBand NDR 400 Gb/s, HDR/NDR200 200 Gb/s; IEEE 802.3: 100 and 25 Gb
# Ethernet) and order-of-magnitude latencies, in `hvdlab.costmodel.FABRICS`. Below: the predicted time to
# all-reduce ResNet-50's gradients (25.6 M float32 parameters, 102 MB) by a ring and by a single parameter server,
# with the reduction treated as free (on a GPU it runs at HBM speed, terabytes per second, far above any link).
# NVLink and PCIe connect the GPUs **inside one node**: an HGX H100/H200 board's NVLink/NVSwitch domain is its 8
# GPUs, so those rows are modelled at 8 ranks only; 64 ranks are 8 such nodes, joined by the fabrics between nodes
# (InfiniBand, RoCE, Ethernet), which are modelled at 8 and 64. This task had no multi-GPU machine to measure on:
# these are predictions from cited figures, not measurements.

# %%
MODEL = 25_557_032 * 4
rows = {n: costmodel.fabric_table(MODEL, n, patterns=("ring", "ps")) for n in (8, 64)}
here = {"ring": costmodel.predict("ring", MODEL, 8, link), "ps": costmodel.predict("ps", MODEL, 8, link)}
INSIDE_A_NODE = ("NVLink", "PCIe")    # links between the GPUs of one node: 8 GPUs on an HGX board
print(f"{'fabric':40} | ring x8 | ring x64 | one server x64  (ms, ResNet-50 fp32)")
for r8, r64 in zip(rows[8], rows[64]):
    if r8["fabric"].startswith(INSIDE_A_NODE):
        print(f"{r8['fabric']:40} | {r8['ring'] * 1e3:7.2f} | {'-':>8} | {'-':>10}   (one node: 8 GPUs at most)")
    else:
        print(f"{r8['fabric']:40} | {r8['ring'] * 1e3:7.2f} | {r64['ring'] * 1e3:8.2f} | {r64['ps'] * 1e3:10.1f}")
nvlink = costmodel.FABRICS[0]
# The model takes NVLink 4 per direction: 900 GB/s per GPU is both directions added.
assert nvlink.name.startswith("NVLink 4") and nvlink.bandwidth == 900e9 / 2
ring8 = 2 * 7 * nvlink.alpha + 2 * 7 / 8 * MODEL / nvlink.bandwidth
assert abs(rows[8][0]["ring"] - ring8) < 1e-12, "the NVLink row is the ring formula at 450 GB/s per direction"
print(f"NVLink 4: {nvlink.bandwidth / 1e9:.0f} GB/s per direction (900 GB/s counts both); ring of 8: "
      f"{ring8 * 1e3:.3f} ms = 2·7·alpha + 2·7/8·S / 450 GB/s")
print(f"{'this machine (fitted loopback), x8':40} | {here['ring'] * 1e3:7.1f} |")
names = [r["fabric"].split(" (")[0] for r in rows[8]] + ["this machine"]
values = [r["ring"] * 1e3 for r in rows[8]] + [here["ring"] * 1e3]
fig, ax = plt.subplots(figsize=(9, 3.4))
ax.barh(names, values, color=["tab:blue"] * len(rows[8]) + ["tab:orange"])
ax.set_xscale("log")
ax.set_xlabel("predicted ring all-reduce of 102 MB on 8 ranks (ms, log scale)")
plt.tight_layout()
plt.show()
assert values[0] < values[1] < values[-1]          # NVLink < PCIe 5 < this machine's loopback

# %% [markdown]
# ## 3 · Two hosts over a slow link (recorded)
#
# On one machine the "network" is a memory copy. `benchmarks/link.py` puts the job's 2 workers on 2 test hosts
# (Linux network namespaces joined by a bridge, sshd in each) and limits each host's outgoing link with
# `tc ... tbf rate R`, then trains the 4.2 M-parameter MLP of `benchmarks/compression.py` once per codec at each
# rate. It needs root, so this notebook does not run it: the numbers below are **from the record** (its date and
# command are printed), not from this run. The cost model predicts each step as measured compute + the codec's
# measured encode/decode time + a ring all-reduce of the codec's bytes over the link's measured rate + one measured
# Horovod call (a negotiation, ~1 ms here) per round of collectives.

# %%
import json
from pathlib import Path

RECORD = "2026-12-02-sweep-full-torch-in-situ"
folder = Path("../benchmarks/results/link")   # relative to notebooks/, where the notebook runs
sweep = json.loads((folder / f"{RECORD}.json").read_text())
command = json.loads((folder / "records.json").read_text())["records"][RECORD]["command"]
print(f"record {RECORD} (from `{command}`), recorded on a shared 2-core machine "
      f"(load average at start {sweep['load_average']['start'][0]:.1f})")
print("link rate one TCP stream measured: " + ", ".join(f"{r} {v:,.0f} MB/s" for r, v in sweep["link_MBps"].items()))
rows = [r for r in sweep["rows"] if r["framework"] == "torch" and r["compression"] in ("none", "fp16", "powersgd:2")]
rates = sweep["rates"]
fig, ax = plt.subplots(figsize=(8, 3.6))
for codec, style in (("none", "ko-"), ("fp16", "bs-"), ("powersgd:2", "g^-")):
    steps = [next(r["step_ms"] for r in rows if r["rate"] == rate and r["compression"] == codec) for rate in rates]
    model = [next(r["predicted_ms"] for r in rows if r["rate"] == rate and r["compression"] == codec) for rate in rates]
    ax.plot(rates, steps, style, label=f"{codec} measured")
    ax.plot(rates, model, style[0] + ":", alpha=0.6, label=f"{codec} cost model")
ax.set_yscale("log")
ax.set_xlabel("link rate (tc tbf; none = unlimited veth)"), ax.set_ylabel("step time (ms, log)")
ax.set_title("PyTorch, 2 hosts x 1 worker, 4.2 M parameters (recorded)")
ax.legend(fontsize=7, ncol=3)
plt.tight_layout()
plt.show()
print(f"{'rate':<8} {'codec':<11} {'link MB/step':>12} {'step ms':>8} {'model ms':>9} {'pred/meas':>9}")
for r in rows:
    print(f"{r['rate']:<8} {r['compression']:<11} {r['link_bytes_per_step'] / 1e6:>12.2f} {r['step_ms']:>8.1f} "
          f"{r['predicted_ms']:>9.1f} {r['predicted_ms'] / r['step_ms']:>9.2f}")
slow = {r["compression"]: r["step_ms"] for r in rows if r["rate"] == rates[0]}
free = {r["compression"]: r["step_ms"] for r in rows if r["rate"] == "none"}
print(f"in the record: fp32 step {slow['none'] / free['none']:.1f}x longer at {rates[0]} than unlimited; "
      f"fp16 / fp32 at {rates[0]}: {slow['fp16'] / slow['none']:.2f}")
# The link carries what the codec hands Horovod (ring factor 1 on 2 ranks), within a few % of headers.
assert all(0.95 < r["link_over_wire"] < 1.1 for r in rows if r["compression"] in ("none", "fp16"))
assert slow["none"] > 3 * free["none"] and slow["fp16"] < 0.75 * slow["none"]

# %% [markdown]
# ## 3b · Hierarchical all-reduce: reduce inside each host first (recorded)
#
# Inside a machine the ranks share memory; between machines they share a link. A **hierarchical** all-reduce uses
# that: the ranks of each host reduce among themselves, one leader per host all-reduces the hosts' sums across the
# link, and each leader hands the result back to its host. With `m` hosts of `k` ranks a flat ring over all `m k`
# ranks crosses each host's link with `2 (mk - 1) / (mk)` buffers each way, the leaders' ring with `2 (m - 1) / m`:
# at 2 hosts x 2 ranks, 1.5 against 1.0. Horovod does this itself (`HOROVOD_HIERARCHICAL_ALLREDUCE`) only in its NCCL
# and MPI paths; over Gloo on CPUs `benchmarks/hierarchical.py` writes it with Horovod's process sets
# (`hvdlab.bench.hierarchical`) and runs both on 2 test hosts x 2 workers, alternating, at each link rate. It needs
# root: the numbers below are **from the record**; `tests/hosts/test_jobs.py` checks the bytes on every `make test`.
# Fewer bytes on the link is not always less time: the host stages are two more collectives in a row, and on these
# test hosts they run on one shared core. The saving is half a buffer over the link; the record shows where that
# pays for the extra stages and where it does not.

# %%
RECORD_H = "2026-12-04-sweep-quiet"
folder_h = Path("../benchmarks/results/hierarchical")
tree = json.loads((folder_h / f"{RECORD_H}.json").read_text())
command_h = json.loads((folder_h / "records.json").read_text())["records"][RECORD_H]["command"]
print(f"record {RECORD_H} (from `{command_h}`): a {tree['args']['megabytes']:g} MB all-reduce, median of "
      f"{tree['args']['repeats']} alternated repeats [min, max]")
print(f"{'rate':<8} {'flat s':>24} {'hierarchical s':>24} {'hier/flat':>9} {'link buffers flat/hier':>23}")
for r in tree["rows"]:
    f, h = r["flat"], r["hierarchical"]
    print(f"{r['rate']:<8} {f['seconds']:>8.4f} [{f['spread'][0]:.4f}, {f['spread'][1]:.4f}] "
          f"{h['seconds']:>8.4f} [{h['spread'][0]:.4f}, {h['spread'][1]:.4f}] {r['ratio']:>9.2f} "
          f"{f['link_buffers']:>11.3f} / {h['link_buffers']:.3f}")
fig, ax = plt.subplots(figsize=(7, 3.2))
xs = np.arange(len(tree["rows"]))
ax.bar(xs - 0.2, [r["flat"]["seconds"] * 1e3 for r in tree["rows"]], 0.4, label="flat ring of 4")
ax.bar(xs + 0.2, [r["hierarchical"]["seconds"] * 1e3 for r in tree["rows"]], 0.4, label="hierarchical")
ax.set_xticks(xs, [r["rate"] for r in tree["rows"]]), ax.set_yscale("log")
ax.set_xlabel("link rate"), ax.set_ylabel("ms per all-reduce (log)"), ax.legend()
ax.set_title("2 hosts x 2 workers, Gloo (recorded)")
plt.tight_layout()
plt.show()
by_rate = {r["rate"]: r for r in tree["rows"]}
slowest, free_h = by_rate[tree["args"]["rates"][0]], by_rate["none"]
# What the host stages cost where the link costs almost nothing, and what half a buffer less on the link saves.
local_cost = free_h["hierarchical"]["seconds"] - free_h["flat"]["seconds"]
for r in tree["rows"]:
    saved = 0.5 * r["buffer_bytes"] / (r["link_MBps"] * 1e6)
    print(f"{r['rate']:<8} half a buffer less over the link saves ~{saved * 1e3:6.1f} ms; the host stages cost "
          f"~{local_cost * 1e3:.1f} ms (from the unlimited row)")
# The bytes follow the formula (within headers) at every rate ...
assert all(1.5 <= r["flat"]["link_buffers"] < 1.58 and 1.0 <= r["hierarchical"]["link_buffers"] < 1.05
           for r in tree["rows"])
# ... and the time follows the bytes only where the link is the bottleneck: a clear gain at the slowest rate, a
# clear loss without a limit, where three collectives in a row (two of them on the host's one shared core) cost
# more than the link time they save.
assert slowest["ratio"] < 0.85 and free_h["ratio"] > 1.2
print("in the record: hierarchical / flat " + ", ".join(f"{r['rate']} {r['ratio']:.2f}" for r in tree["rows"]))

# %% [markdown]
# ## 3c · A heterogeneous pair: one host behind a slower link (measured in this run)
#
# A cloud cluster is seldom uniform: one node may sit behind a slower NIC or a busier switch port. Two test hosts
# (`hvdlab.testhosts`: network namespaces with their own link and sshd, each on its own share of this machine's
# cores) run one worker each; the job is started by `hvdsync.launch.run` from `node1` (`hvdlab.heterogeneous`). It
# runs twice: both links unlimited, then with only `node2`'s outgoing link limited to 100 Mbit/s. Each time the
# workers time the ring all-reduce of a 4 MB buffer in float32 and in float16, then train the digits MLP for 3 epochs
# with `data.shares: adaptive`. A ring is as fast as its slowest link, so one slow host slows every rank. hvdsync's
# adaptive shares balance *compute*: each rank's samples per second while reading and computing, the all-reduce wait
# left out (`hvdsync.core.train.adaptive`). Whatever they do, they cannot make a link faster: every step still pays
# the slow all-reduce. Where they end is printed for this run (one core per host, shared with whatever else runs on
# the machine, so the measured rates, and the shares with them, can move). What helps is a choice of what crosses
# the link: fewer bytes (float16, `sync.compression`, notebook 15),
# fewer all-reduces (`sync.accumulate`, notebook 06), or a placement that keeps the slow host out of the ring. Test
# hosts need root; without it this section says why and measures nothing.

# %%
import os

from hvdlab import heterogeneous
from hvdlab.testhosts import TestHosts, unavailable
from hvdsync.config import Config

SLOW = "100mbit"
train_cfg = Config().replace(train={"np": 2, "epochs": 3, "hidden": 256}, data={"batch_size": 32, "shares": "adaptive"},
                             tracking={"enabled": False}, monitor={"every": 0}).to_dict()
why = unavailable()
hetero = {}
if why:
    print(f"not measured in this run: {why}")
else:
    with TestHosts(2, prefix=f"nb03h{os.getpid()}", subnet="10.77.7", split_cpus=True) as cluster:
        hetero["both links unlimited"] = heterogeneous.run_job(cluster, megabytes=4, cfg_dict=train_cfg)
        heterogeneous.limit_link(cluster, "node2", SLOW)
        hetero[f"node2 at {SLOW}"] = heterogeneous.run_job(cluster, megabytes=4, cfg_dict=train_cfg)
for name, ranks in hetero.items():
    t = ranks[0]["allreduce_s"]
    shares = [f"{h['shares'][0]:.2f}/{h['shares'][1]:.2f}" for h in ranks[0]["history"]]
    print(f"{name:22}: 4 MB all-reduce float32 {t['float32'] * 1e3:7.1f} ms, float16 {t['float16'] * 1e3:7.1f} ms; "
          f"adaptive shares per epoch (node1/node2) {', '.join(shares)}")
if hetero:
    fast, slow = hetero["both links unlimited"][0]["allreduce_s"], hetero[f"node2 at {SLOW}"][0]["allreduce_s"]
    print(f"in this run: one slow host made the float32 all-reduce {slow['float32'] / fast['float32']:.1f}x slower "
          f"for both ranks; over the slow link float16 took {slow['float16'] / slow['float32']:.2f}x float32's time")
    # 4 MB through 100 Mbit/s is ~0.3 s whatever else happens: a wide margin on a loaded machine.
    assert slow["float32"] > 3 * fast["float32"], "one host's slow link slows the whole ring"
    assert slow["float16"] < 0.75 * slow["float32"], "half the bytes over the slow link: clearly less time"
    last = hetero[f"node2 at {SLOW}"][0]["history"][-1]["shares"]
    print(f"in this run the adaptive shares ended at {last[0]:.2f}/{last[1]:.2f} (node1/node2) with node2's link "
          "slow: they follow the rates measured while reading and computing; the all-reduce stays as slow")


# %% [markdown]
# ## 4 · NCCL vs Gloo
#
# Horovod hands the collective to a library. **Gloo** (Facebook's) runs on CPUs over TCP: a CPU thread copies the
# buffer into socket writes and adds the received chunks (our gamma), so on GPUs every gradient would first cross
# PCIe to host memory and back. **NCCL** (NVIDIA's) runs the ring (or tree) as CUDA kernels on the GPUs: chunks
# travel GPU to GPU over NVLink/NVSwitch inside a node and over InfiniBand/RoCE with GPUDirect RDMA between nodes,
# the adds run on the GPU, and NCCL picks rings or trees by message size and topology. That is why a GPU build of
# Horovod uses `HOROVOD_GPU_OPERATIONS=NCCL` (README, Docker) and keeps Gloo for the CPU and the control plane. The
# alpha-beta model still applies; only the figures change by two to three orders of magnitude.

# %% [markdown]
# ## What to take away
#
# * A collective's time is latency × steps + bytes / bandwidth (+ the cost of adding): the alpha-beta-gamma model,
#   fitted on this machine from a handful of all-reduces, predicts the others within the factor printed above.
# * On one host Horovod's Gloo ring is bounded by loopback TCP and memory copies: the bandwidth fitted above. For
#   comparison, nominal link rates per direction (vendors' figures, not measured here): NVLink 4 450 GB/s (its
#   900 GB/s per GPU counts both directions) among the 8 GPUs of one HGX node, InfiniBand NDR 50 GB/s and 25 GbE
#   3.1 GB/s between nodes.
# * The ring's bandwidth term hardly grows with the number of ranks; a single server's does (notebook 04).
# * NCCL on GPUs, Gloo on CPUs: same algorithms, different links and where the adds happen.
# * Reducing inside each host first sends 1.0 buffer over each host's link instead of the flat ring's 1.5 at
#   2 hosts x 2 ranks (recorded, and checked in the tests); it pays where the link is slow (0.73x the flat time at
#   100 Mbit/s in the record), breaks even around 1 Gbit/s here (0.99x) and loses without a limit (2.15x): the
#   extra host stages cost a fixed time that only a slow link hides.
# * A heterogeneous cluster runs at its slowest link: one host at 100 Mbit/s made both ranks' all-reduce several
#   times slower (§3c, measured in this run where test hosts can be made; asserted above 3x). Adaptive shares
#   balance compute, not links; fewer bytes over the slow link (float16: asserted below 0.75x) is what helps.
# * Over a real bandwidth limit the bytes are the step: in the record above, the fp32 step at the slowest rate is
#   several times the unlimited one, and halving the bytes (fp16) cuts it by about as much as the link's share of
#   the step (the printed ratios; asserted: more than 3x, and below 0.75x).
