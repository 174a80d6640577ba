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
# # 12 · 十二、遵循主流框架的最佳实践与配置 — Following the mainstream frameworks' best practices and configuration (1/2)
#
# > **The guide's section, point by point** (its own points in its order, translated; after each arrow: where this
# > notebook shows it with running code, or why it cannot here):
# >
# > 1. Today's frameworks (TensorFlow, PyTorch) ship highly packaged, capable modules for synchronous distributed
# >    training. → part 1 §1: one `Config` trained through hvdsync in PyTorch and in TensorFlow, steps, bytes and
# >    accuracy compared; §2 the two adapters side by side.
# > 2. PyTorch's `DistributedDataParallel` automates nearly every detail of gradient synchronisation. → part 1 §4: DDP
# >    over Gloo beside Horovod on the same model and data, equal parameters, step times side by side.
# > 3. Initialise the process group correctly, so that every process knows the global picture (its rank, the world
# >    size). → part 1 §4 (`init_process_group`) and every hvdsync job (`hvd.init` in `ht.init`).
# > 4. Wrap the model in the DDP wrapper. → part 1 §4.
# > 5. Use a distributed sampler so that the ranks' shares of the data do not overlap. → part 2 §3 leaves the sharding
# >    out (every sample read twice, twice the steps, counted); the notebooks shard with hvdsync's `PlanSampler`;
# >    part 1 §4b runs PyTorch's own `DistributedSampler` in plain Horovod and DDP + `torchrun` scripts.
# > 6. Choose the backend to fit the hardware: a high-performance MPI library on CPU clusters, the built-in library
# >    (NCCL) on GPU clusters. → part 1 §3 reads which backends this Horovod build has; the jobs here run on Gloo
# >    (CPU, one machine); NCCL needs GPUs and is described, not run.
# > 7. Follow the official configuration steps closely to avoid most common traps. → part 2 §2-§4: three traps
# >    measured on 2 workers (no broadcast, no sharding, the wrong learning-rate scaling).
#
# Horovod's guides for PyTorch and for TensorFlow ask for the same handful of steps, whatever the model:
#
# 1. **initialise** Horovod in every worker process (and give each worker its share of the CPU cores, or its own
#    GPU);
# 2. **wrap the optimizer**, so that gradients are all-reduced before every update;
# 3. **broadcast** rank 0's initial parameters and optimizer state, so that every worker starts from the same model;
# 4. **shard the data**, so that each worker reads its own part of every global batch;
# 5. **scale the learning rate** to the global batch, which grows with the number of workers;
#
# and, around them, the choice of the **communication backend** (Gloo, NCCL or MPI) that carries the all-reduces.
# hvdsync does these steps with the same function names in both frameworks (`hvdsync.torch` and
# `hvdsync.tensorflow` mirror each other) and takes the choices from one `Config`. PyTorch also ships its own
# way of doing steps 1-3, `torch.distributed` and `DistributedDataParallel` (DDP); section 4 puts it beside Horovod.

# %%
import dataclasses
import time
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from hvdsync import launch
from hvdsync.config import Config, ConfigError
from hvdsync.torch import FitResult, scaled_lr

# The learning rate is meant for ONE worker with 32 samples per step; `lr_scaling: linear` multiplies it by the
# number of workers, because 2 workers x 32 samples make a global batch of 64.
cfg = Config().replace(train={"np": 2, "epochs": 8, "optimizer": "sgd", "momentum": 0.9, "lr": 0.02,
                              "lr_scaling": "linear", "seed": 0},
                       data={"dataset": "digits", "batch_size": 32}, tracking={"enabled": False})
print(f"{cfg.train.np} workers x batch {cfg.data.batch_size} = global batch {cfg.train.np * cfg.data.batch_size}; "
      f"lr {cfg.train.lr} for one worker -> {scaled_lr(cfg.train.lr, cfg.train.np, cfg.train.lr_scaling):.2f} "
      f"for {cfg.train.np} ({cfg.train.lr_scaling} scaling); {cfg.train.epochs} epochs")

# %% [markdown]
# ## 1 · The same training in PyTorch and TensorFlow
#
# `hvdsync.launch.local.train` is what `hvdsync train` runs: it checks the config against this Horovod build, starts the
# workers and calls the chosen adapter's `fit`; `hvdsync.launch.local.train_many` does the same for several configs in
# one job of workers (one Horovod start-up; each framework's Horovod module shares the one Horovod started in the
# worker). Only `train.framework` changes between the two runs below; the
# data, its sharding, the loss scale, the learning rate, the epochs and the metrics are the same code (hvdsync's
# core), so the columns can be compared directly. The two models are the same MLP (64 → 64 → 10) but start from each
# framework's own default initialisation, so their accuracies are close, not equal.

# %%
FRAMEWORKS = ("torch", "tensorflow")
start = time.perf_counter()
trained = launch.train_many([cfg.replace(train={"framework": framework}) for framework in FRAMEWORKS])
# rank 0's FitResult of each run (train_many adds a few fields of its own to the dictionary)
side_by_side = {framework: FitResult(**{f.name: r[f.name] for f in dataclasses.fields(FitResult)})
                for framework, r in zip(FRAMEWORKS, trained)}
print(f"torch, then tensorflow, in one job: launched and trained in {time.perf_counter() - start:.1f} s "
      f"(worker start-up included)")

print(f"\n{'':<10} | test acc. | train s | samples/s | MB to all-reduce | all-reduce rounds | optimizer steps | "
      f"params equal across ranks")
for framework, r in side_by_side.items():
    print(f"{framework:<10} | {r.test_accuracy:>9.4f} | {r.total_seconds:>7.2f} | {r.samples_per_second:>9.0f} | "
          f"{r.wire['bytes'] / 1e6:>16.3f} | {r.allreduce_rounds:>17.0f} | {r.optimizer_steps:>15} | "
          f"{r.param_spread == 0.0}")
pt, tf_ = side_by_side["torch"], side_by_side["tensorflow"]
# 1,348 training samples, global batch 64: ceil(1348 / 64) = 22 steps per epoch; 4,810 float32 parameters.
assert pt.optimizer_steps == tf_.optimizer_steps == pt.allreduce_rounds == tf_.allreduce_rounds == 22 * cfg.train.epochs
assert pt.wire["bytes"] == tf_.wire["bytes"] == 4 * 4810 * 22 * cfg.train.epochs, "the same bytes on the wire"
assert pt.param_spread == tf_.param_spread == 0.0, "every rank holds the same model"
assert min(pt.test_accuracy, tf_.test_accuracy) > 0.9
print(f"\nboth frameworks handed {pt.wire['bytes'] / 1e6:.3f} MB of {', '.join(pt.wire['dtypes'])} gradients to "
      f"Horovod in {pt.allreduce_rounds:.0f} rounds; test accuracy {pt.test_accuracy:.3f} (torch) vs "
      f"{tf_.test_accuracy:.3f} (tensorflow)")

for framework, r in side_by_side.items():
    seconds = [h["epoch_seconds"] for h in r.history]
    print(f"{framework:<10}: epoch 1 took {seconds[0]:.2f} s, the later ones {np.mean(seconds[1:]):.2f} s on average "
          f"({1e3 * np.mean(seconds[1:]) * r.epochs / r.optimizer_steps:.1f} ms per step)")

fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.5))
for framework, r in side_by_side.items():
    a1.plot([h["epoch"] + 1 for h in r.history], [h["test_accuracy"] for h in r.history], "o-", label=framework)
a1.set_xlabel("epoch")
a1.set_ylabel("test accuracy")
a1.set_title("Same config, two frameworks")
a1.legend()
for framework, r in side_by_side.items():
    a2.semilogy([h["epoch"] + 1 for h in r.history], [h["epoch_seconds"] for h in r.history], "o-", label=framework)
a2.set_xlabel("epoch")
a2.set_ylabel("seconds (slowest rank)")
a2.set_title("Time per epoch (TensorFlow traces its graphs in epoch 1)")
a2.legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# The wire is identical: the same 4 gradient tensors (4,810 float32 numbers), all-reduced once per optimizer step,
# and both frameworks end with equal parameters on every rank (asserted). The times are not comparable one to one:
# the MLP is tiny, so a step is mostly framework overhead, and TensorFlow's first epoch includes tracing its
# `tf.function`s (epoch 1 against the later ones, printed above and plotted).
#
# ## 2 · One API, two frameworks
#
# The adapters have the same file names, public names and signatures (`hvdsync.adapter.Adapter`; a test holds both to
# it and names what one framework has alone, such as the backend class, `TorchBackend` and `TensorFlowBackend`, or
# Keras' callbacks), so the best-practice steps read the same. This
# is, written out, what `fit` does in each framework (the PyTorch version is the function run on the workers in
# section 4 and in part 2; `fit` runs the TensorFlow one through `TensorFlowBackend`):
#
# | step | PyTorch: `import hvdsync.torch as ht` | TensorFlow: `import hvdsync.tensorflow as ht` |
# |---|---|---|
# | 1 · init | `info = ht.init(cfg)` — `hvd.init()`, threads per worker, seeds | `info = ht.init(cfg)` — the same |
# | model | `model = ht.mlp(64, cfg.train.hidden, 10)` (`nn.Module`) | `model = ht.mlp(64, cfg.train.hidden, 10)` (Keras 3) |
# | 5 · lr | `lr = scaled_lr(cfg.train.lr, info.size, cfg.train.lr_scaling)` | the same |
# | 2 · optimizer | `opt = ht.distributed_optimizer(ht.local_optimizer(cfg, model, lr), model, cfg.sync)` | the same line |
# | 3 · broadcast | `ht.broadcast_state(model, opt)` | `ht.broadcast_state(model, opt)` |
# | 4 · shards | `sampler = ht.PlanSampler(train_set, batch_size=32)`; `loader = DataLoader(train_set, batch_sampler=sampler)` | `loader = ht.ShardedLoader(x, y, ShardPlan(len(x), info.size, 32), info.rank)` |
# | epoch | `sampler.set_epoch(epoch)`; `for micro, step in sampler.steps(loader):` | `loader.set_epoch(epoch)`; `for micro, step in loader:` |
#
# and the distributed step, where the frameworks really differ:
#
# ```python
# # PyTorch: gradients up to sync.grouped_mb (25 MiB; these models' are under 0.3 MiB) go in grouped buckets, each
# # all-reduced once backward has produced its last gradient; larger models get Horovod's per-gradient hooks
# opt.zero_grad()
# for x, y in micro:
#     loss = F.cross_entropy(model(x), y, reduction="sum")
#     (loss * sampler.scale(step)).backward()   # = loss_scale(step.global_count, info.size, cfg.sync.op)
# opt.step()                      # waits for the all-reduces, then updates
# ```
#
# ```python
# # TensorFlow (Keras 3): gradients come from a tape; hvdsync's optimizer sums them, then all-reduces them as a group
# for x, y in micro:
#     with tf.GradientTape() as tape:
#         logits = model(x, training=True)
#         loss = tf.reduce_sum(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))
#         scaled = loss * loss_scale(step.global_count, info.size, cfg.sync.op)
#     opt.accumulate(tape.gradient(scaled, model.trainable_variables))
# opt.synchronize()               # one grouped all-reduce
# opt.step()                      # the Keras optimizer's update
# ```
#
# Both multiply the *summed* loss by `loss_scale` (notebook 06: the gradient Horovod averages is then the mean over
# the global batch), and both must make the same collective calls in the same order on every rank.
#
# ## 3 · Choosing the backend: Gloo, NCCL or MPI
#
# Horovod moves tensors with one of three libraries, chosen when Horovod is built (`HOROVOD_WITH_GLOO`,
# `HOROVOD_WITH_MPI`, `HOROVOD_GPU_OPERATIONS=NCCL` at `pip install` time) and when it is launched
# (`horovodrun --gloo` or `--mpi`; hvdsync's launcher uses Gloo):
#
# | backend | what it is for |
# |---|---|
# | **Gloo** | CPU tensors on any machine, no extra software; also the controller (who is ready for which tensor) for jobs launched with `--gloo`. The default for laptops, CI and CPU clusters. |
# | **NCCL** | all-reduce of **GPU** tensors, over NVLink/PCIe inside a node and InfiniBand/RoCE between nodes: the choice for every multi-GPU job. It only moves GPU memory; Gloo or MPI still run the controller. |
# | **MPI** | clusters that already have an MPI stack and scheduler (Slurm + Open MPI / Intel MPI): `mpirun` starts the workers, MPI runs the controller and CPU collectives. Adasum on CPU needs it. |
#
# A terminal answers "what was this Horovod built with" with `horovodrun --check-build`. From Python, hvdsync reads
# the frameworks from the installed extensions without importing one, and the workers of section 4 ask Horovod
# itself (`hvd.gloo_built()`, `hvd.nccl_built()`, `hvd.mpi_built()`, and which controller is running). The same
# workers then train with DDP and with Horovod, so one start-up serves both sections.

# %%
def train_one_epoch(model, opt, train_set, plan, rank, op):
    """The PyTorch step of section 2, for either wrapper: Horovod's optimizer or DDP's module all-reduce the
    gradients; both average over the ranks, so the same loss scale gives the global batch's mean gradient."""
    import time

    import torch.nn.functional as F
    from torch.utils.data import DataLoader

    import hvdsync.torch as ht

    sampler = ht.PlanSampler.from_plan(plan, rank, op)
    loader = DataLoader(train_set, batch_sampler=sampler)
    sampler.set_epoch(0)
    seconds = []
    for micro, step in sampler.steps(loader):
        start = time.perf_counter()
        opt.zero_grad()
        for x, y in micro:
            (F.cross_entropy(model(x), y, reduction="sum") * sampler.scale(step)).backward()
        opt.step()
        seconds.append(time.perf_counter() - start)
    module = getattr(model, "module", model)      # DDP wraps the user's module
    return {"params": [p.detach().numpy().copy() for p in module.parameters()], "step_seconds": seconds}


# %%
def ddp_beside_horovod(cfg_dict, scripts):
    """One epoch of the same model from the same start on the same shards: Horovod (through hvdsync), then PyTorch
    DDP over Gloo. Returns the build's facts, both runs' final parameters and their step times; then (section 4b)
    the plain scripts in the folder ``scripts`` and hvdsync on the same unshuffled samples."""
    import importlib.util
    import os
    import socket

    import horovod.torch as hvd
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import TensorDataset

    import hvdsync.torch as ht
    from hvdsync import datasets
    from hvdsync.config import Config
    from hvdsync.torch import scaled_lr, ShardPlan

    cfg = Config.from_dict(cfg_dict)
    info = ht.init(cfg)
    out = {"built": {name: bool(getattr(hvd, f"{name}_built")()) for name in ("gloo", "mpi", "nccl", "cuda")},
           "enabled": {"gloo": bool(hvd.gloo_enabled()), "mpi": bool(hvd.mpi_enabled())}}
    def shared_port(name):
        # torch.distributed needs its own rendezvous: rank 0 picks a free port and Horovod's broadcast tells the others.
        port = None
        if info.rank == 0:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
        return hvd.broadcast_object(port, root_rank=0, name=name)

    port = shared_port("ddp.port")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=info.rank, world_size=info.size)
    data = datasets.load(cfg.data, cfg.train.seed)
    train_set = TensorDataset(torch.from_numpy(data.x_train), torch.from_numpy(data.y_train))
    plan = ShardPlan(len(data.x_train), info.size, cfg.data.batch_size, cfg.sync.accumulate, cfg.train.seed,
                     cfg.data.shuffle)
    lr = scaled_lr(cfg.train.lr, info.size, cfg.train.lr_scaling)

    for name in ("horovod", "ddp"):
        ht.init(cfg)                              # re-seeds torch: both runs build the same model
        model = ht.mlp(data.n_features, cfg.train.hidden, data.n_classes)
        if name == "horovod":
            opt = ht.distributed_optimizer(ht.local_optimizer(cfg, model, lr), model, cfg.sync)
            ht.broadcast_state(model, opt)
        else:                                     # DDP broadcasts rank 0's parameters when it wraps the model
            model = DistributedDataParallel(model)
            opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=cfg.train.momentum)
        out[name] = train_one_epoch(model, opt, train_set, plan, info.rank, cfg.sync.op)
        dist.barrier()
    dist.destroy_process_group()

    # Section 4b: examples/plain/'s scripts, each as its launcher would run it (Horovod's: its rank and size;
    # torchrun: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), and hvdsync's loop on the same unshuffled samples.
    def script(name):
        spec = importlib.util.spec_from_file_location(name, os.path.join(scripts, f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    argv = ["--epochs", "1", "--lr", str(lr), "--momentum", str(cfg.train.momentum), "--batch-size",
            str(cfg.data.batch_size), "--seed", str(cfg.train.seed), "--no-shuffle"]
    out["plain_horovod"] = script("horovod_torch").main(argv)
    port = shared_port("torchrun.port")
    os.environ.update(RANK=str(info.rank), WORLD_SIZE=str(info.size), LOCAL_RANK=str(info.local_rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    out["plain_ddp"] = script("ddp_torchrun").main(argv)
    from hvdsync.fitting import fit_loop

    unshuffled = cfg.replace(data={"shuffle": False}, train={"epochs": 1})
    ht.init(unshuffled)
    backend = ht.build(unshuffled, data)
    fit_loop(unshuffled, backend, data)
    out["hvdsync_unshuffled"] = [p.copy() for p in backend.parameters()]
    return out


# %%
start = time.perf_counter()
SCRIPTS = str(Path("../examples/plain").resolve())   # relative to notebooks/, where the notebook runs
rank0, rank1 = launch.run(ddp_beside_horovod, args=(cfg.to_dict(), SCRIPTS), np=cfg.train.np, sync=cfg.sync,
                          progress=False)
print(f"2 workers: build facts, one Horovod epoch and one DDP epoch in {time.perf_counter() - start:.1f} s "
      f"(start-up included)")
print("Horovod built for frameworks:", ", ".join(launch.horovod_frameworks()))
for rank, r in enumerate((rank0, rank1)):
    print(f"rank {rank}: built with " + ", ".join(f"{k}={v}" for k, v in r["built"].items())
          + " | running: " + ", ".join(f"{k}={v}" for k, v in r["enabled"].items()))
built, running = rank0["built"], rank0["enabled"]
assert set(launch.horovod_frameworks()) == {"torch", "tensorflow"}
assert built["gloo"] and running["gloo"] and not running["mpi"], "hvdsync's launcher runs Gloo"

# What the build allows is checked before any worker starts: Adasum on CPU needs MPI.
try:
    launch.preflight(cfg.replace(sync={"op": "adasum"}))
    print("sync.op=adasum: accepted (this Horovod has MPI)")
    assert built["mpi"]
except ConfigError as error:
    print("sync.op=adasum:", error)
    assert not built["mpi"]
print("in this run the build has " + ", ".join(k for k in ("gloo", "mpi", "nccl") if built[k])
      + "; it lacks " + (", ".join(k for k in ("gloo", "mpi", "nccl") if not built[k]) or "none of them"))

# %% [markdown]
# The cell above read this environment's Horovod build rather than assuming it; where the build has no MPI,
# hvdsync rejects `sync.op: adasum` before starting a worker. On a GPU cluster Horovod is built with
# `HOROVOD_GPU_OPERATIONS=NCCL`, and step 1 of the list above also pins each worker to the GPU of its local rank
# (`hvd.local_rank()`), where its model and batches live; the all-reduces of GPU gradients then go through NCCL.
# hvdsync's `init` does that pinning, one rank per GPU, and stops with one line where a host has more ranks than
# GPUs (`hvdsync.core.train.gpus`).
#
# ## 4 · PyTorch's own way: `torch.distributed` and DDP beside Horovod
#
# PyTorch ships the same recipe natively: `torch.distributed.init_process_group` (backend `gloo` on CPUs, `nccl`
# on GPUs) joins the workers, and `DistributedDataParallel` broadcasts rank 0's parameters when it wraps the model
# and all-reduces (averages) the gradients in buckets from backward hooks. It needs no Horovod, but it needs a
# rendezvous (an address and port every rank can reach) and a launcher that sets rank and world size (`torchrun`).
# Here the workers were started by hvdsync's launcher, so Horovod's rank and size were reused for
# `init_process_group` and Horovod's `broadcast_object` handed rank 0's free port to the other rank. Both runs
# below train the MLP one epoch (22 steps) from the same seed on the same shards with the same loss scale: the
# maths is the same, so the parameters must agree to float32 rounding.

# %%
def max_diff(a, b):
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b))


for rank, r in enumerate((rank0, rank1)):
    print(f"rank {rank}: DDP vs Horovod, largest parameter difference after one epoch: "
          f"{max_diff(r['ddp']['params'], r['horovod']['params']):.1e}")
ranks_apart = {name: max_diff(rank0[name]["params"], rank1[name]["params"]) for name in ("horovod", "ddp")}
print("largest difference between the two ranks' parameters: "
      + ", ".join(f"{name} {d:.1e}" for name, d in ranks_apart.items()))
assert all(max_diff(r["ddp"]["params"], r["horovod"]["params"]) < 1e-5 for r in (rank0, rank1)), "the same training"
assert ranks_apart["horovod"] == 0.0 and ranks_apart["ddp"] < 1e-6, "each keeps one model on both ranks"
assert len(rank0["ddp"]["step_seconds"]) == len(rank0["horovod"]["step_seconds"]) == 22

median = {name: 1e3 * float(np.median(rank0[name]["step_seconds"][1:])) for name in ("horovod", "ddp")}
print(f"in this run: median step on rank 0 {median['horovod']:.2f} ms with Horovod, {median['ddp']:.2f} ms with "
      f"DDP (ratio DDP/Horovod {median['ddp'] / median['horovod']:.2f}; a 4,810-parameter MLP on shared CPUs, "
      f"so this compares overheads, not all-reduce speed)")

fig, ax = plt.subplots(figsize=(7, 3.4))
for name in ("horovod", "ddp"):
    ax.plot(range(1, 23), 1e3 * np.array(rank0[name]["step_seconds"]), "o-", ms=3, label=name)
ax.set_xlabel("step of the epoch")
ax.set_ylabel("ms (rank 0)")
ax.set_title("One epoch, same model and shards: Horovod vs PyTorch DDP (Gloo)")
ax.legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 4b · Plain scripts: Horovod with `horovodrun`, DDP with `torchrun`, both with `DistributedSampler`
#
# The two recipes as a user writes them without hvdsync: [`examples/plain/horovod_torch.py`](../examples/plain/horovod_torch.py)
# (launched with `horovodrun -np 2 -H localhost:2 --gloo python examples/plain/horovod_torch.py`) and
# [`examples/plain/ddp_torchrun.py`](../examples/plain/ddp_torchrun.py) (`torchrun --standalone --nproc-per-node 2
# examples/plain/ddp_torchrun.py`). Each shards with PyTorch's **`DistributedSampler`**: rank r reads samples r,
# r + 2, r + 4, ... of the epoch's order, so the two ranks' shares never overlap and together cover the epoch once.
# The workers above ran both scripts' `main` as their launchers would (for DDP, with the variables `torchrun` sets),
# one epoch with this notebook's learning rate, and hvdsync's own loop on the same samples unshuffled
# (`data.shuffle: false`; `DistributedSampler(shuffle=False)`). Every global step then reads the same 64 samples on
# all three sides, in another split between the ranks, and the average gradient does not depend on the split.
# `tests/parallel/test_plain_scripts.py` runs the scripts with `horovodrun` and `torchrun` themselves.
#
# **Predict, then run.** Different launchers, different samplers, different gradient plumbing: how far apart will
# the parameters be after one epoch (the largest difference), and how far from hvdsync's?

# %%
my_prediction = None   # your guess, e.g. 1e-2

# %%
plain = {name: max_diff(rank0[name], rank0["hvdsync_unshuffled"]) for name in ("plain_horovod", "plain_ddp")}
moved = max_diff(rank0["hvdsync_unshuffled"], rank0["horovod"]["params"])
print("largest difference from hvdsync's parameters after one unshuffled epoch: "
      + ", ".join(f"{name} {d:.1e}" for name, d in plain.items()))
print(f"(for scale: hvdsync's shuffled epoch of section 4 ended {moved:.1e} away from its unshuffled one)")
print(f"your prediction: {my_prediction}" if my_prediction is not None else
      "(write a prediction above and run again to compare)")
assert all(d < 1e-5 for d in plain.values()), "the same training, written three ways"
assert max_diff(rank1["plain_ddp"], rank0["plain_ddp"]) < 1e-6 and moved > 1e-3

# %% [markdown]
# DDP and Horovod implement the same idea, and on the same data they compute the same model (asserted above).
# What differs is around it: DDP is part of PyTorch (no extra build), overlaps bucketed all-reduces with backward
# by default, and is started by `torchrun`; Horovod covers PyTorch, TensorFlow and Keras with one API and one
# launcher, and adds its own features (tensor fusion, compression, Adasum, elastic jobs). hvdsync builds on
# Horovod so that both frameworks share one config and one training loop.

# %% [markdown]
# ## What to take away
#
# * **The best practices are the same in both frameworks, and so is hvdsync's API.** The same config trained in
#   PyTorch and TensorFlow took the same 176 steps and handed Horovod the same bytes, with every rank ending on the
#   same parameters (asserted in section 1); only the framework's own overhead and its default initialisation
#   differ.
# * **Pick the backend for the hardware, and ask the build.** Gloo for CPUs and anything without extra software,
#   NCCL for GPU tensors, MPI where the cluster has it (and for Adasum on CPU). `horovodrun --check-build` or
#   `hvd.*_built()` say what a build has (section 3 read this one's); hvdsync refuses a config the build cannot
#   run before any worker starts.
# * **PyTorch's DDP is the same recipe in PyTorch's own API.** One epoch with DDP over Gloo and one with Horovod
#   ended on the same parameters to float32 rounding (asserted in section 4); the step times printed there are
#   this run's, on a tiny model.
# * What goes wrong when a step is left out (no broadcast, no sharding, the wrong learning-rate scaling) is
#   measured in part 2, `12b_framework_best_practices_mistakes`.
