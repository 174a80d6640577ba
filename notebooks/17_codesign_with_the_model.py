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
# # 17 · 十七、将同步策略与模型架构设计协同考量 — Considering the synchronisation strategy together with the model's architecture
#
# > **The guide's section, point by point** (its own points in its order, translated; after each arrow: where this
# > notebook shows it with running code, or why it cannot here):
# >
# > 1. The synchronisation strategy belongs in the model's design from the start, not as a repair afterwards. → the
# >    sections below each take one design choice.
# > 2. For sparse models with huge parameter counts, dense gradient synchronisation is very inefficient and a
# >    dedicated communication strategy may be needed. → §3: a 100k-row embedding's gradient, allgather of the touched
# >    rows against a dense all-reduce (bytes counted), and where allgather stops paying.
# > 3. Some operations, such as normalisation layers, must synchronise statistics across devices, and how they do it
# >    shapes the synchronisation. → §2: local against synchronised batch norm at 2 and 16 samples per rank.
# > 4. Model parallelism, placing parts of the model on different devices, changes the communication pattern. → §4:
# >    the model split over a rank pair, and over two pairs data-parallel across them: activations against gradients,
# >    bytes counted.
# > 5. Algorithm and systems engineers must work together on architectures that are efficient and easy to synchronise.
# >    → advice; nothing to run.
#
# Synchronous data parallelism treats the model as a black box: every rank holds all of it, computes gradients on
# its share of the batch, and all-reduces every gradient. Three kinds of layers break that picture, and each has a
# known way out that changes *what* is synchronised rather than *how often*:
#
# * **Batch normalisation** normalises with statistics of the batch a rank sees. With small per-rank batches
#   (large models, large images, many ranks) those statistics are noisy and differ between ranks. A
#   **synchronised batch norm** all-reduces per-channel `[sum, sum of squares, count]` so every rank normalises with
#   the statistics of the *global* batch (`hvdsync.torch.SyncBatchNormalization`,
#   `hvdsync.tensorflow.SyncBatchNormalization`): one small all-reduce per layer per step, in the forward pass.
# * **Embedding tables** are huge but a step touches a few rows: the gradient is sparse (PyTorch
#   `nn.Embedding(sparse=True)`, TensorFlow `IndexedSlices`). Densifying it and all-reducing the whole table (Horovod's
#   `sparse_as_dense`) moves the table every step; **allgathering the touched rows** (indices + values) moves only
#   what changed. `sync.sparse: dense | allgather` picks one, for your own model, in both frameworks.
# * **A model that does not fit on one worker** must be split: each worker holds some layers (a pipeline stage) and
#   activations travel between them. Combined with data parallelism across copies of the pipeline (Horovod process
#   sets), the bytes moved change from *gradients of all parameters* to *activations at the cut* plus gradients of
#   half the parameters.
#
# We measure all three on real Horovod workers: accuracy with local and synchronised batch norm at small
# per-rank batches, the bytes of a 100k-row embedding table's gradient both ways, and a model split over a rank pair
# (and over two pairs, data parallel across them) against plain data parallelism.

# %%
import time

import matplotlib.pyplot as plt
import numpy as np

from hvdsync import launch
from hvdsync.config import Config
from hvdlab import ring
from hvdsync.core.comm import sparse

TABLE, DIM, LOOKUPS = 100_000, 16, 300       # the embedding table, and ids looked up per rank per step
BATCHES, BN_EPOCHS = (2, 16), 1              # per-rank batch sizes for batch norm, epochs over digits
HELD_OUT = 0.8                               # digits held out for batch norm's test accuracy (the rest trains)
print(Config.from_dict({"sync": {"sparse": "allgather"}}).sync)

# %% [markdown]
# ## 1 · The measurements, in two Horovod jobs
#
# The worker functions live in the lab package beside hvdsync, hvdlab (`hvdlab.torch.codesign`,
# `hvdlab.tensorflow.codesign`, `hvdlab.torch.split`), and train through hvdsync's adapters; here they are only called. One job of 2 workers runs the PyTorch measurements and then the
# TensorFlow ones (batch norm and embeddings; each framework's Horovod module shares the one Horovod started in the
# worker, so the second framework costs no second start-up), and one PyTorch job of 4 workers runs the split: two
# pairs, data parallel across them, against plain data parallelism on the same 4 workers.

# %%
def torch_job(table, dim, lookups, batches, epochs, held_out):
    from hvdlab.torch import codesign

    return {"embedding": codesign.embedding_exchange(table, dim, lookups, steps=4),
            "bn": codesign.batchnorm_comparison(batches, epochs=epochs, test_fraction=held_out)}


def tensorflow_job(table, dim, lookups, batches, epochs, held_out):
    from hvdlab.tensorflow import codesign

    return {"embedding": codesign.embedding_exchange(table, dim, lookups, steps=4),
            "bn": codesign.batchnorm_comparison(batches, epochs=epochs, test_fraction=held_out)}


def both_frameworks_job(*args):
    return {"torch": torch_job(*args), "tensorflow": tensorflow_job(*args)}


def split_job():
    from hvdlab.torch import split

    return split.model_split_comparison(hidden=512, global_batches=(32, 512), steps=6)


start = time.perf_counter()
args = (TABLE, DIM, LOOKUPS, BATCHES, BN_EPOCHS, HELD_OUT)
two = launch.run(both_frameworks_job, args=args, np=2, progress=False)
pt, tf = [[rank[f] for rank in two] for f in ("torch", "tensorflow")]   # per framework, per rank
four = launch.run(split_job, np=4, progress=False)
print(f"2 Horovod jobs (2 and 4 workers) in {time.perf_counter() - start:.0f} s, start-up included")

# %% [markdown]
# ## 2 · Synchronised against local batch norm at small per-rank batches
#
# The same MLP (Linear, batch norm, ReLU, Linear) trained on 20% of digits (the other 80% measures the accuracy; a
# small training set keeps the 2-sample run's steps, printed below, few and quick) through `fit` with the user's own model, from the same start on the same samples, once with the framework's batch
# norm and once with hvdsync's synchronised one.
# With 2 samples per rank, local batch norm normalises every feature over 2 values (each becomes ±1), and its
# running statistics, used at test time, are the average of such 2-sample statistics on each rank.

# %%
rows = [r for job in (pt, tf) for r in job[0]["bn"]]
print("framework  | per rank | global | local BN | sync BN | steps")
for fw in ("torch", "tensorflow"):
    for b in BATCHES:
        local = next(r for r in rows if r["framework"] == fw and r["batch_per_rank"] == b and r["bn"] == "local")
        sync = next(r for r in rows if r["framework"] == fw and r["batch_per_rank"] == b and r["bn"] == "sync")
        print(f"{fw:<10} | {b:>8} | {2 * b:>6} | {local['test_accuracy']:>8.4f} | {sync['test_accuracy']:>7.4f} "
              f"| {local['steps']}")
    smallest = [r["test_accuracy"] for r in rows if r["framework"] == fw and r["batch_per_rank"] == BATCHES[0]]
    assert smallest[1] > smallest[0], f"{fw}: at {BATCHES[0]} samples per rank synchronised batch norm does better"
    largest = [r["test_accuracy"] for r in rows if r["framework"] == fw and r["batch_per_rank"] == BATCHES[-1]]
    print(f"in this run, {fw}: sync minus local batch norm, test accuracy: {smallest[1] - smallest[0]:+.3f} at "
          f"{BATCHES[0]} samples per rank, {largest[1] - largest[0]:+.3f} at {BATCHES[-1]}")

fig, axes = plt.subplots(1, 2, figsize=(10, 3.5), sharey=True)
for ax, fw in zip(axes, ("torch", "tensorflow")):
    for kind, style in (("local", "o--"), ("sync", "s-")):
        acc = [next(r["test_accuracy"] for r in rows if r["framework"] == fw and r["batch_per_rank"] == b
                    and r["bn"] == kind) for b in BATCHES]
        ax.plot(BATCHES, acc, style, label=f"{kind} batch norm")
    ax.set_xscale("log", base=2)
    ax.set_xticks(BATCHES, [str(b) for b in BATCHES])
    ax.set_xlabel("samples per rank per step (2 ranks)")
    ax.set_title(f"{fw}: test accuracy after {BN_EPOCHS} epoch(s)")
    ax.legend(fontsize=8)
axes[0].set_ylabel("test accuracy (digits)")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 3 · Sparse gradients: allgather the touched rows, or all-reduce the table
#
# A 100,000 × 16 table; each rank looks up 300 ids per step (4 per sample, half of them among 50 popular rows, so ids
# repeat). `sync.sparse: allgather` coalesces the gradient (one row per distinct id), then hands Horovod int32
# indices and float32 rows; `dense` hands it the whole table. Every tensor handed over is counted
# (`WireCounter`), and compared with `hvdlab.embedding.exchange_formula`. Both ways start from the same model and
# see the same ids, so their reduced gradients and final parameters must agree.
#
# **Predict, then run.** The dense all-reduce hands Horovod the whole table's gradient every step: 100,000 × 16
# float32 values, 6.4 MB. How many times fewer bytes will the allgather of the touched rows hand over (one rank,
# the same 4 steps)? Write your guess in the next cell (a number), then run the one after it.

# %%
my_prediction = None   # your guess, e.g. 20.0

# %%
print("framework  | rank | distinct rows/step | bytes allgather | bytes dense | x fewer | max |Δgrad| | ranks equal")
for fw, job in (("torch", pt), ("tensorflow", tf)):
    for r in (job[0]["embedding"], job[1]["embedding"]):
        ag, de = r["modes"]["allgather"], r["modes"]["dense"]
        print(f"{fw:<10} | {r['rank']:>4} | {str(r['distinct_rows']):>18} | {ag['bytes']:>15,} | {de['bytes']:>11,} "
              f"| {de['bytes'] / ag['bytes']:>7.0f} | {r['grad_difference']:>10.1e} | "
              f"{ag['spread'] == 0.0 and de['spread'] == 0.0}")
        assert ag["bytes"] == r["formula"]["allgather"] and de["bytes"] == r["formula"]["dense"], "counted = formula"
        assert de["bytes"] / ag["bytes"] >= 50, "the target: at least 50x fewer bytes than the dense all-reduce"
        assert r["grad_difference"] <= 1e-6 * r["grad_scale"], "the same reduced gradient (float rounding only)"
        assert ag["spread"] == de["spread"] == 0.0, "identical parameters on every rank"
fewer = {f"{fw} rank {r['rank']}": round(r["modes"]["dense"]["bytes"] / r["modes"]["allgather"]["bytes"])
         for fw, job in (("torch", pt), ("tensorflow", tf)) for r in (job[0]["embedding"], job[1]["embedding"])}
print(f"your prediction: {my_prediction}; measured: {fewer} times fewer" if my_prediction is not None else
      f"measured: {fewer} times fewer (write a prediction above and run again to compare)")

# %% [markdown]
# The allgather's advantage shrinks as the world grows: every rank *receives* every other rank's rows, while a ring
# all-reduce moves about twice the table whatever the number of ranks. `hvdsync.core.comm.sparse.crossover_rows` is the
# number of distinct rows per rank where the two meet; past it, densifying is cheaper (and it is the only way with
# codecs that reshape gradients, such as top-k, which the config enforces).

# %%
ranks = np.array([2, 8, 64, 512])
rows_per_rank = np.logspace(1, 5, 60)
measured = pt[0]["embedding"]
fig, ax = plt.subplots(figsize=(7, 4))
for w, color in zip(ranks, plt.cm.viridis(np.linspace(0, 0.85, len(ranks)))):
    ax.plot(rows_per_rank, [(w - 1) * sparse.allgather_bytes(int(r), DIM) for r in rows_per_rank], color=color,
            label=f"allgather, {w} ranks")
    ax.axhline(ring.ring_bytes_per_rank(int(w), sparse.dense_bytes(TABLE, DIM)), color=color, ls=":", lw=0.9)
    print(f"{w:>4} ranks: allgather moves more than the dense ring above "
          f"{sparse.crossover_rows(TABLE, DIM, int(w)):,.0f} distinct rows per rank")
mean_rows = float(np.mean(measured["distinct_rows"]))
ax.plot([mean_rows], [sparse.allgather_bytes(int(mean_rows), DIM)], "r*", ms=12, label="measured here (2 ranks)")
ax.set_xscale("log")
ax.set_yscale("log")
ax.set_xlabel("distinct rows touched per rank per step")
ax.set_ylabel("bytes reaching one rank per step")
ax.set_title("Embedding gradient: allgather (lines) vs ring all-reduce of the table (dotted)")
ax.legend(fontsize=7)
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 4 · Splitting the model: activations instead of gradients
#
# A 4-layer MLP 64 → 512 → 512 → 512 → 10 (564k parameters) cut after the second layer. **Data parallel**: every
# rank holds all of it and all-reduces all gradients. **Split**: rank 0 holds the first two layers, rank 1 the rest;
# each step rank 0 sends its activations (batch × 512 floats) to rank 1 and gets their gradient back. On 4
# workers, two such pairs run data parallel: ranks 0 and 2 (stage 0) and ranks 1 and 3 (stage 1) all-reduce their
# stage's gradients in their own Horovod process set. Against it, plain data parallelism on the same 4 workers.
# Same global batches, same SGD steps: the parameters must end equal to data parallelism's.

# %%
print("workers | global batch | layout        | bytes/step (rank 0) | of which activations | params/rank | "
      "s/step | max |θ − θ_dp|")
table = []
for job in (four[0],):
    for row in job["rows"]:
        for name, key in (("data parallel", "data_parallel"), ("split + DP", "split")):
            m = row[key]
            table.append((job["size"], row["global_batch"], name, m))
            diff = row["param_difference"] if key == "split" else 0.0
            print(f"{job['size']:>7} | {row['global_batch']:>12} | {name:<13} | {m['bytes_per_step']:>19,.0f} | "
                  f"{m.get('activation_bytes_per_step', 0):>20,.0f} | {m['params_per_rank']:>11,} | "
                  f"{m['seconds_per_step']:>6.3f} | {diff:.1e}")
        assert row["param_difference"] < 1e-5, "the split computes the same steps as data parallelism"
        assert row["split"]["params_per_rank"] < 0.6 * row["data_parallel"]["params_per_rank"]
activations = [row["split"]["activation_bytes_per_step"] for row in four[0]["rows"]]
assert activations == sorted(activations) and activations[0] < activations[-1], "activations grow with the batch"

# %% [markdown]
# The split written out by hand, in one process: stage 0 computes its activations and "sends" them (a detached
# copy stands for the message), stage 1 finishes the forward pass, the loss and its backward pass, and "sends back"
# the gradient of the activations, from which stage 0 runs its own backward pass. Pair 0's half of the same global
# batches of 32 as the package's run, the same two stages from the same seed (`split.stages`), and an unsplit copy
# trained beside it. Then the package's 4-worker numbers are checked against this version.

# %%
import torch
from torch import nn

from hvdsync import datasets
from hvdlab.torch import split

HIDDEN, GLOBAL, STEPS, LR, SEED, PAIRS = 512, 32, 6, 0.05, 0, 2   # model_split_comparison's settings in split_job
digits_25 = datasets.digits(0.25, SEED)
x, y = torch.from_numpy(digits_25.x_train), torch.from_numpy(digits_25.y_train)
rng = np.random.default_rng([SEED, GLOBAL])
batches = [np.array_split(rng.choice(len(x), GLOBAL, replace=False), PAIRS)[0] for _ in range(STEPS)]
stage0, stage1 = split.stages(x.shape[1], HIDDEN, 10, SEED)
whole = nn.Sequential(*split.stages(x.shape[1], HIDDEN, 10, SEED))      # the same start, not split
opts = [torch.optim.SGD(m.parameters(), lr=LR) for m in (stage0, stage1, whole)]
activation_bytes = 0
for b in batches:
    for opt in opts:
        opt.zero_grad()
    h = stage0(x[b])                                       # worker 0: its layers
    received = h.detach().requires_grad_()                 # the message to worker 1
    nn.functional.cross_entropy(stage1(received), y[b]).backward()   # worker 1: its layers, the loss, backward
    h.backward(received.grad)                              # the gradient sent back: worker 0's backward
    activation_bytes += h.numel() * h.element_size()       # what worker 0 hands over per step
    nn.functional.cross_entropy(whole(x[b]), y[b]).backward()
    for opt in opts:
        opt.step()
by_hand = [p.detach() for p in (*stage0.parameters(), *stage1.parameters())]
gap = max(float((a - b).abs().max()) for a, b in zip(by_hand, whole.parameters()))
package = next(r for r in four[0]["rows"] if r["global_batch"] == GLOBAL)["split"]   # rank 0: stage 0 of pair 0
print(f"split by hand vs the unsplit model after {STEPS} steps: largest parameter difference {gap:.1e}")
print(f"stage 0 sends {activation_bytes / STEPS:,.0f} activation bytes per step by hand, "
      f"{package['activation_bytes_per_step']:,.0f} in the package's run; it holds "
      f"{sum(p.numel() for p in stage0.parameters()):,} parameters by hand, {package['params_per_rank']:,} there")
assert gap < 1e-5, "the split is the same maths as the whole model"
assert activation_bytes / STEPS == package["activation_bytes_per_step"]
assert sum(p.numel() for p in stage0.parameters()) == package["params_per_rank"]

# %%
fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 3.8))
labels = [f"{w} workers\nbatch {g}\n{name}" for w, g, name, _ in table]
a1.bar(range(len(table)), [m["bytes_per_step"] / 1e6 for *_, m in table], color="tab:blue",
       label="handed to Horovod (rank 0)")
a1.bar(range(len(table)), [m.get("activation_bytes_per_step", 0) / 1e6 for *_, m in table], color="tab:orange",
       label="of which activations")
a1.set_xticks(range(len(table)), labels, fontsize=6)
a1.set_ylabel("MB per step")
a1.set_title("What moves: gradients of all parameters, or activations")
a1.legend(fontsize=8)
a2.bar(range(len(table)), [m["seconds_per_step"] * 1e3 for *_, m in table], color="tab:green")
a2.set_xticks(range(len(table)), labels, fontsize=6)
a2.set_ylabel("ms per step (slowest rank, median)")
a2.set_title("Time per step (2 shared CPU cores: noisy)")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## What to take away
#
# * **Batch norm couples samples, so it couples ranks.** At 2 samples per rank, local batch norm normalises with
#   statistics of a handful of samples and each rank keeps its own running statistics; the synchronised layer
#   normalises with the global batch's, and in this run it kept the accuracy that local batch norm lost at the
#   smallest batches (asserted in section 2). At 16 samples per rank the gap is small (in this run: printed in
#   section 2), and the synchronised one adds an all-reduce per layer per forward pass, on the critical path: use it
#   when per-rank batches are small.
# * **Sparse gradients want a sparse exchange, until they are not sparse.** For a 100k-row table with a few hundred
#   rows touched per step, `sync.sparse: allgather` hands Horovod at least 50 times fewer bytes than the dense
#   all-reduce (asserted; this run's ratio is printed in section 3; counted, equal to the formula), with the same
#   reduced gradient. But a rank receives every other
#   rank's rows: the gain falls with the world size and the rows touched, and past `crossover_rows` densify. Codecs
#   that reshape gradients (top-k, PowerSGD) and Adasum need the dense form; the config refuses the combination
#   instead of crashing mid-run.
# * **A split trades gradient bytes for activation bytes, and for waiting.** The split halves the parameters a worker
#   holds; it moves batch × width floats at the cut, and all-reduces only its stage's gradients across the pairs:
#   the activation part grows with the batch (asserted in section 4; the orange bars), the gradient part with the
#   model. Written out by hand (section 4), the split is a dozen lines and the same maths as the whole model. Without micro-batches the two stages take turns (one idles while the other computes), which is
#   what pipeline schedules (GPipe, 1F1B) recover. Horovod has no point-to-point send; broadcasts inside a
#   two-rank process set stand in for it, and process sets (which work with Gloo here) give the data-parallel
#   groups per stage. The split is a change to the model's code, not a training option: hvdsync measures it
#   (`hvdlab.torch.split`) rather than offering it as a `sync.mode`.
