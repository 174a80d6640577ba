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
# # 02 · 二、夯实数据预处理与加载的同步基础 — Laying a synchronised foundation for data preprocessing and loading
#
# > **The guide's section, point by point** (its own points in its order, translated; after each arrow: where this
# > notebook shows it with running code, or why it cannot here):
# >
# > 1. Synchronisation starts with the data: every worker (each GPU process, say) must get batches that are
# >    independent and evenly sized. → §1 the global plan (`ShardPlan`); §5 two real workers read disjoint, equal
# >    shares that cover the epoch (counted).
# > 2. Usually done with one global random seed for the data set and a different sub-seed per worker. → §3: what must
# >    be equal and what must differ; `rank_seed` derived from the global seed.
# > 3. Loading needs a parallel data loader (the framework's multi-worker loading module). → §6: a `DataLoader` with
# >    worker processes against one that reads in line, the wait per step timed.
# > 4. Each worker loads on its own, but the partition must be decided globally, so that no sample is read twice or
# >    missed. → §2: per-rank shuffles miss a share of the data (counted); §5 every sample once.
# > 5. Preprocessing such as image augmentation keeps the same random logic on every worker: varied data, yet
# >    reproducible. → §4: augmentation keyed by the sample (`sample_rng`) gives the same data on 1 and 2 workers.
#
# Notebook 01 showed that W workers × batch B take the same step as one process × batch W·B — *if* the W workers
# together read exactly that global batch. This notebook is about the two things that decide what each worker
# reads and computes:
#
# * **the data plan (sharding).** Every epoch, each sample must be read exactly once by exactly one worker, and every
#   worker must take the same number of steps: a worker with one step more would call all-reduce alone and wait
#   forever (a deadlock, not an error). hvdsync makes *one global order* per epoch from `(seed, epoch)` — the same on
#   every rank and for every world size — cuts it into global batches, and splits each batch evenly among the
#   ranks (`hvdsync.core.train.sharding.ShardPlan`).
# * **the seeds.** Some randomness must be *identical* on all ranks (the initial model, the epoch's order), some must
#   *differ* (dropout masks, noise: W copies of the same mask waste the randomness), and augmentation is best keyed
#   by the *sample*, so that a run's augmented data does not depend on how many workers read it
#   (`hvdsync.core.train.seeding`: `rank_seed`, `sample_rng`).
#
# We look at the plan on a toy dataset, count what goes wrong without it, check seeds and augmentation, and then
# let 2 real Horovod workers read the digits data set through hvdsync's loader and verify what they read.

# %%
import time

import matplotlib.pyplot as plt
import numpy as np

from hvdsync import launch
from hvdsync.config import Config
from hvdsync import datasets
from hvdsync.core.train import seeding
from hvdlab.sharding import naive_shards
from hvdsync.torch import ShardPlan

cfg = Config().replace(train={"np": 2, "seed": 0}, data={"dataset": "digits", "batch_size": 32},
                       tracking={"enabled": False})
digits = datasets.load(cfg.data, cfg.train.seed)
N = len(digits.x_train)
print(f"digits training set: {N} samples of {digits.n_features} pixels")

# %% [markdown]
# ## 1 · The global plan
#
# Ten samples, two ranks, two samples per rank per step. The epoch's order is a permutation seeded by
# `(seed, epoch)` only; global step s takes the next `world_size × batch_size` samples of it and splits them
# between the ranks.

# %%
toy = ShardPlan(dataset_size=10, world_size=2, batch_size=2, seed=0)
print("epoch 0 global order:", toy.order(0).tolist())
for rank in range(toy.world_size):
    print(f"rank {rank} reads, step by step:", [s.indices.tolist() for s in toy.epoch(0, rank)])
print("epoch 1 global order:", toy.order(1).tolist(), "(a new order each epoch)")

# The order does not depend on the world size: 1 or 5 ranks read the same sequence, only cut differently.
for world in (1, 5):
    other = ShardPlan(10, world, 2, seed=0)
    print(f"{world} rank(s): order {other.order(0).tolist()}, "
          f"step 0 = {[other.epoch(0, r)[0].indices.tolist() for r in range(world)]}")

# An uneven case: 1,348 digits on 3 ranks with 32 per rank. Shares differ by at most one sample, step counts not
# at all (the last, shorter step is split too), so no rank ever calls all-reduce alone.
uneven = ShardPlan(N, 3, 32, seed=0)
steps = [uneven.epoch(0, r) for r in range(3)]
print("3 ranks: steps per rank", [len(s) for s in steps], "| samples per rank",
      [sum(x.local_count for x in s) for s in steps], "| last step's shares", [s[-1].local_count for s in steps])

# %% [markdown]
# ## 2 · What goes wrong without a plan
#
# A common hand-written version: every rank shuffles the data on its own and keeps every W-th sample
# (`naive_shards`). If the ranks' shuffles differ — an unseeded shuffle, or one seeded per rank — their shares
# overlap: some samples are read twice in an epoch and others never. Each sample lands in rank r's share with
# probability 1/W, independently, so a fraction (1 − 1/W)^W of the data is skipped every epoch: 25 % with 2
# workers, towards 1/e ≈ 37 % with many.

# %%
def read_counts(shares, n):
    """How many times each of the n samples is read, given every rank's list of indices."""
    return np.bincount(np.concatenate(shares), minlength=n)


print(" W | missed (never read) | read twice or more | expected missed (1-1/W)^W")
naive_missed = []
for world in (2, 4, 8, 16):
    counts = read_counts([naive_shards(N, world, r, seed=0) for r in range(world)], N)
    naive_missed.append((counts == 0).mean())
    print(f"{world:>2} | {100 * naive_missed[-1]:>17.1f} % | {100 * (counts > 1).mean():>16.1f} % | "
          f"{100 * (1 - 1 / world) ** world:>10.1f} %")
# The rule is a probability; the counts above must follow it (N = 1,348 samples: a few points of noise at most).
assert all(abs(m - (1 - 1 / w) ** w) < 0.05 for m, w in zip(naive_missed, (2, 4, 8, 16)))
assert naive_missed[0] < naive_missed[-1] < 1 / np.e + 0.05
for world in (2, 4, 8, 16):
    planned = read_counts([ShardPlan(N, world, 32, seed=0).rank_indices(0, r) for r in range(world)], N)
    assert planned.min() == planned.max() == 1
print("with ShardPlan: every sample read exactly once for W = 2, 4, 8, 16")

# %% [markdown]
# ## 3 · Seeds: what must be equal, what must differ
#
# `hvdsync.torch.init` seeds the framework with the **global** seed on every rank (so every rank builds the same
# initial model, and a 1-worker run starts where a W-worker run starts; the broadcast from rank 0 then guarantees
# it), and Python's and numpy's generators with the **rank seed** `rank_seed(seed, rank)`, derived with numpy's
# `SeedSequence` so nearby seeds and ranks give unrelated streams.

# %%
print("global seed 0 -> rank seeds:", [seeding.rank_seed(0, r) for r in range(4)])
print("global seed 1 -> rank seeds:", [seeding.rank_seed(1, r) for r in range(4)])

# %% [markdown]
# ## 4 · Augmentation that does not depend on the world size
#
# Random augmentation drawn from a rank's generator depends on *who* reads a sample and *in which order*: run the
# same job on 1 and on 2 workers and every sample is augmented differently. `seeding.sample_rng(seed, epoch,
# index)` makes a generator per sample and epoch instead, so the augmented data set is a property of the run, not
# of the world size. The augmentation below (a shift by up to one pixel plus a little noise) is a stand-in for any
# random transform; `augment_as_read` augments the samples one rank reads, in its reading order, with either kind
# of generator.

# %%
def augment(image, rng):
    """Shift an 8x8 digit by up to one pixel in each direction and add a little noise."""
    shifted = np.roll(image.reshape(8, 8), tuple(rng.integers(-1, 2, size=2)), axis=(0, 1))
    return np.clip(shifted + rng.normal(0.0, 0.05, size=(8, 8)), 0.0, 1.0).ravel()


def augment_as_read(x, plan, epoch, rank, keyed_by):
    """{index: augmented sample} for what `rank` reads in `epoch`; one generator per sample or per rank."""
    rank_rng = np.random.default_rng(seeding.rank_seed(plan.seed, rank))
    return {int(i): augment(x[i], seeding.sample_rng(plan.seed, epoch, i) if keyed_by == "sample" else rank_rng)
            for i in plan.rank_indices(epoch, rank)}


# %% [markdown]
# ## 5 · Two real workers read an epoch
#
# The function below runs on 2 Horovod workers. Each one builds the plan for its world size and reads two epochs
# through hvdsync's PyTorch loader (`hvdsync.torch.ShardedLoader`, what `fit` uses), recording which indices it
# got and checking the tensors are those rows. It also reports what a naive unseeded shuffle would have given it,
# its generators' first draws and two dropout-style masks, and its augmented samples.

# %%
def read_and_report(cfg_dict, epochs):
    import numpy as np
    import torch

    import hvdsync.torch as ht
    from hvdsync.config import Config
    from hvdsync import datasets
    from hvdsync.core.train import seeding
    from hvdlab.sharding import naive_shards
    from hvdsync.torch import ShardPlan

    cfg = Config.from_dict(cfg_dict)
    info = ht.init(cfg)
    data = datasets.load(cfg.data, cfg.train.seed)
    plan = ShardPlan(len(data.x_train), info.size, cfg.data.batch_size, cfg.sync.accumulate, cfg.train.seed,
                     cfg.data.shuffle)
    loader = ht.ShardedLoader(data.x_train, data.y_train, plan, info.rank)
    read, rows_match = {}, True
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        indices = []
        for micro, step in loader:
            indices.append(step.indices)
            x = torch.cat([xb for xb, _ in micro])
            rows_match &= bool(np.array_equal(x.numpy(), data.x_train[step.indices]))
        read[epoch] = np.concatenate(indices).tolist()
    # Draws right after init: torch from the global seed, numpy from this rank's seed.
    torch_draw, numpy_draw = torch.rand(4).tolist(), np.random.rand(4).tolist()
    # Two dropout-style masks: from torch's default generator, and from a generator seeded with the rank seed.
    default_mask = (torch.rand(2000) < 0.5).numpy()
    own = torch.Generator().manual_seed(seeding.rank_seed(cfg.train.seed, info.rank))
    rank_mask = (torch.rand(2000, generator=own) < 0.5).numpy()
    return {
        "rank": info.rank, "size": info.size, "steps_per_epoch": len(loader), "read": read, "rows_match": rows_match,
        "naive_unseeded": naive_shards(len(data.x_train), info.size, info.rank, seed=None).tolist(),
        "torch_draw": torch_draw, "numpy_draw": numpy_draw, "default_mask": default_mask, "rank_mask": rank_mask,
        "aug_sample": augment_as_read(data.x_train, plan, 0, info.rank, "sample"),
        "aug_rank": augment_as_read(data.x_train, plan, 0, info.rank, "rank"),
    }


start = time.perf_counter()
workers = launch.run(read_and_report, args=(cfg.to_dict(), 2), np=cfg.train.np, progress=False)
print(f"2 Horovod workers read 2 epochs in {time.perf_counter() - start:.1f} s (start-up included)")

# %%
plan = ShardPlan(N, cfg.train.np, cfg.data.batch_size, seed=cfg.train.seed)
for epoch in (0, 1):
    shares = [np.array(w["read"][epoch]) for w in workers]
    overlap = np.intersect1d(shares[0], shares[1])
    covered = np.union1d(shares[0], shares[1])
    print(f"epoch {epoch}: rank 0 read {len(shares[0])}, rank 1 read {len(shares[1])}; "
          f"read by both: {len(overlap)}; distinct samples read: {len(covered)} of {N}")
    assert len(overlap) == 0 and len(covered) == N and sum(map(len, shares)) == N
    assert all(np.array_equal(shares[r], plan.rank_indices(epoch, r)) for r in range(2)), "as the plan says"
assert all(w["rows_match"] for w in workers) and workers[0]["steps_per_epoch"] == workers[1]["steps_per_epoch"]
print(f"both ranks took {workers[0]['steps_per_epoch']} steps per epoch and got exactly the planned rows")

planned_counts = read_counts([np.array(w["read"][0]) for w in workers], N)
naive_counts = read_counts([np.array(w["naive_unseeded"]) for w in workers], N)
print(f"naive unseeded shuffle on the same 2 workers: {(naive_counts == 0).sum()} samples never read, "
      f"{(naive_counts > 1).sum()} read twice ({100 * (naive_counts == 0).mean():.1f} % of the epoch lost)")

fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.5))
bins = np.arange(3)
a1.bar(bins - 0.2, [(planned_counts == k).sum() for k in bins], width=0.4, label="ShardPlan")
a1.bar(bins + 0.2, [(naive_counts == k).sum() for k in bins], width=0.4, label="naive (unseeded shuffle)")
a1.set_xticks(bins, ["never", "once", "twice"])
a1.set_ylabel("samples")
a1.set_title("How often each sample is read in one epoch\n(2 real workers)")
a1.legend(fontsize=8)
worlds = [2, 4, 8, 16]
a2.plot(worlds, 100 * np.array(naive_missed), "o-", label="naive, counted")
a2.plot(worlds, [100 * (1 - 1 / w) ** w for w in worlds], "k:", label="(1 − 1/W)^W")
a2.axhline(0, color="tab:blue", label="ShardPlan, counted")
a2.set_xscale("log", base=2)
a2.set_xlabel("workers W")
a2.set_ylabel("% of the epoch never read")
a2.set_title("Skipped samples per epoch")
a2.legend(fontsize=8)
plt.tight_layout()
plt.show()

# %% [markdown]
# ### Seeds on the real workers
#
# Right after `hvdsync.torch.init`, torch's first draws are equal on both ranks (global seed: same initial model)
# and numpy's differ (rank seed). A dropout mask drawn from torch's *default* generator is therefore the same on
# both ranks — every rank would drop the same units for its own samples — while a generator seeded with
# `rank_seed` gives independent masks (about half the entries agree, as for two coin-flip sequences).

# %%
w0, w1 = workers
print("torch draws, rank 0 / rank 1:", np.round(w0["torch_draw"], 4), np.round(w1["torch_draw"], 4))
print("numpy draws, rank 0 / rank 1:", np.round(w0["numpy_draw"], 4), np.round(w1["numpy_draw"], 4))
same_default = (w0["default_mask"] == w1["default_mask"]).mean()
same_rank = (w0["rank_mask"] == w1["rank_mask"]).mean()
print(f"dropout masks equal between the ranks: default generator {100 * same_default:.1f} %, "
      f"rank-seeded generator {100 * same_rank:.1f} %")
assert w0["torch_draw"] == w1["torch_draw"] and w0["numpy_draw"] != w1["numpy_draw"]
assert same_default == 1.0 and 0.4 < same_rank < 0.6

# %% [markdown]
# ### Augmentation: 1 worker against 2 workers
#
# The same run (global batch 64) on one worker, augmented here in this process with the same function, against
# what the two workers produced, compared sample by sample.

# %%
single = ShardPlan(N, 1, cfg.train.np * cfg.data.batch_size, seed=cfg.train.seed)
one = {key: augment_as_read(digits.x_train, single, 0, 0, key) for key in ("sample", "rank")}
two = {key: {**w0[f"aug_{key}"], **w1[f"aug_{key}"]} for key in ("sample", "rank")}
for key in ("sample", "rank"):
    assert sorted(one[key]) == sorted(two[key]) == list(range(N))
    diffs = np.array([np.abs(one[key][i] - two[key][i]).max() for i in range(N)])
    print(f"generator per {key:>6}: samples augmented differently on 1 vs 2 workers: {(diffs > 0).sum():>4} of {N}"
          f" (largest pixel difference {diffs.max():.3f})")
    if key == "sample":
        assert diffs.max() == 0.0, "sample-keyed augmentation must not depend on the world size"
next_epoch = augment(digits.x_train[0], seeding.sample_rng(0, 1, 0))
print("...and still a new augmentation every epoch:", not np.array_equal(next_epoch, one["sample"][0]))

show = [0, 1, 2, 3, 4]
rows = [("original", {i: digits.x_train[i] for i in show}), ("per sample, 1 worker", one["sample"]),
        ("per sample, 2 workers", two["sample"]), ("per rank, 1 worker", one["rank"]),
        ("per rank, 2 workers", two["rank"])]
fig, axes = plt.subplots(len(rows), len(show), figsize=(6, 6.5))
for (label, images), row in zip(rows, axes):
    for i, ax in zip(show, row):
        ax.imshow(np.asarray(images[i]).reshape(8, 8), cmap="gray_r", vmin=0, vmax=1)
        ax.set_xticks([])
        ax.set_yticks([])
    row[0].set_ylabel(label, rotation=0, ha="right", va="center", fontsize=8)
fig.suptitle("Augmented digits: keyed by sample they match, keyed by rank they do not")
plt.show()

# %% [markdown]
# ## 6 · Parallel, prefetching loaders
#
# The plan says *which* samples a worker reads; how fast it reads them is the loader's job. A loader that reads
# in line makes every step wait for its batch; torch's `DataLoader` with `num_workers` reads batches in worker
# processes, `prefetch_factor` batches ahead each, while the training step runs (`tf.data`'s `prefetch` does the
# same in TensorFlow). Here reading a batch of 32 digits costs 50 ms (a sleep standing in for disk or network I/O
# and decoding, which leaves the cores to the step), the step is a real forward and backward pass of a small MLP,
# and the same steps run with `num_workers=0` and with 4 prefetching worker processes, timing how long each step
# waits for its batch (the whole step's time scatters with whatever else shares the cores). hvdsync's
# `ShardedLoader` slices arrays already in memory, where there is nothing to hide; with files, hand the indices of
# its plan to a `DataLoader` like this one.
#
# **Predict, then run.** Reading a batch takes 50 ms; the step's own forward and backward pass takes far less. How
# many milliseconds will a step wait for its batch (the median of 16 steps) with `num_workers=0`, and with 4
# prefetching worker processes (`prefetch_factor=2`)? Write your guess in the next cell (a dict of two numbers of
# ms), then run the one after it.

# %%
my_prediction = None   # your guess, e.g. {"in_line": 20.0, "prefetched": 10.0}

# %%
import warnings

import torch
from torch.utils.data import DataLoader, Dataset


class SlowBatches(Dataset):
    """Batch b of the digits (32 samples), taking `read_s` to read."""

    def __init__(self, x, y, read_s):
        self.x, self.y, self.read_s = torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(y), read_s

    def __len__(self):
        return len(self.x) // 32

    def __getitem__(self, b):
        time.sleep(self.read_s)
        return self.x[32 * b:32 * (b + 1)], self.y[32 * b:32 * (b + 1)]


torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
READ_S, STEPS = 0.05, 16


def step_times(**loader_options):
    data = SlowBatches(digits.x_train, digits.y_train, READ_S)
    loader = iter(DataLoader(data, batch_size=None, **loader_options))   # batch_size=None: the dataset batches
    next(loader)                     # the first batch also pays for starting the worker processes
    waits, steps = [], []
    for _ in range(STEPS):
        t0 = time.perf_counter()
        xb, yb = next(loader)
        waits.append(time.perf_counter() - t0)     # how long the step waited for its batch
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
        steps.append(time.perf_counter() - t0)
    return 1e3 * np.array(waits), 1e3 * np.array(steps)


in_line = step_times(num_workers=0)
with warnings.catch_warnings():
    # torch warns about more worker processes than cores; these wait on I/O, not on a core.
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    prefetched = step_times(num_workers=4, prefetch_factor=2)
print(f"reading one batch: {READ_S * 1e3:.0f} ms; the step waited for its batch {np.median(in_line[0]):.1f} ms with "
      f"num_workers=0 and {np.median(prefetched[0]):.1f} ms with 4 prefetching workers (medians of {STEPS})")
print(f"in this run a whole step took {np.median(in_line[1]):.1f} ms and {np.median(prefetched[1]):.1f} ms")
waited = {"in_line": float(np.median(in_line[0])), "prefetched": float(np.median(prefetched[0]))}
measured = ", ".join(f"{key} {ms:.1f} ms" for key, ms in waited.items())
print(f"your prediction: {my_prediction}; measured: {measured}" if my_prediction is not None else
      f"measured: {measured} (write a prediction above and run again to compare)")
assert np.median(prefetched[0]) < 0.5 * READ_S * 1e3 <= np.median(in_line[0]), "the workers hide most of the reading"

fig, ax = plt.subplots(figsize=(7, 2.8))
ax.plot(in_line[0], "o-", label="num_workers=0 (reads in line)")
ax.plot(prefetched[0], "s-", label="num_workers=4, prefetch_factor=2")
ax.axhline(READ_S * 1e3, color="grey", ls=":", label="one read")
ax.set_xlabel("step"), ax.set_ylabel("ms waited for the batch"), ax.legend(fontsize=8)
ax.set_title("Waiting for data with and without a prefetching loader")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## What to take away
#
# * **Plan the global batch, then split it.** One seeded order per epoch, the same on every rank and for every
#   world size, cut into global batches and split evenly: every sample is read exactly once per epoch (the 2 real
#   workers above read disjoint shares covering all 1,348 samples, twice), and every rank takes the same number of
#   steps, so no rank waits alone in an all-reduce. This is also what makes W × B equal to 1 × W·B (notebook 01).
# * **Unplanned shards lose data silently.** Independent per-rank shuffles skipped about a quarter of the epoch with
#   2 workers and approach 1/e with many (counted and asserted against (1 − 1/W)^W) — no error, just a worse
#   model.
# * **Read ahead.** A loader with worker processes prefetches the next batches while the step runs, so the step
#   waits for its batch less than half a read (section 6, asserted; this run's step times printed there).
# * **Seed by role.** Same seed for what must agree (initial model, data order), `rank_seed` for what must differ
#   (dropout, noise: torch's default generator gives every rank the same mask), and `sample_rng` for augmentation,
#   so that the augmented data set — and hence the run — is the same on 1 worker or 2.
