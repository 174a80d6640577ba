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
# # 06 · 六、实施梯度累加以模拟更大批次训练 — Applying gradient accumulation to simulate training with larger batches
#
# > **The guide's section, point by point** (its own points in its order, translated; after each arrow: where this
# > notebook shows it with running code, or why it cannot here):
# >
# > 1. One GPU's memory may not hold the batch size one would like. → §4: the bytes a step holds for its backward
# >    pass, measured for batch 8 and batch 32.
# > 2. Gradient accumulation: each worker runs several small batches in a row without updating, adding their gradients
# >    up locally. → §2: backward passes against optimizer steps (hvdsync's counters).
# > 3. After the set number of batches, the accumulated gradient is synchronised once and the parameters updated. →
# >    §2: one all-reduce per optimizer step (counted).
# > 4. This equals training with a 'virtual batch' several times the real one. → §2: accumulate = 1, 2, 4, 8 over the
# >    same samples give the same parameters; §1 the averaging factor that makes it so.
# > 5. It eases the memory demand and synchronises a steadier large-batch gradient: an important tool when resources
# >    are short. → §3: samples/s of batch 8, 4 × 8 accumulated and 32, measured; §4: the memory saving, measured
# >    (4 × 8 accumulated holds a quarter of batch 32's activation bytes).
#
# The gradient of a step is a mean over the global batch, and a mean can be computed in pieces. With
# **gradient accumulation** each worker splits its share of the step into k *micro-batches*, runs forward and
# backward on each one, lets the gradients *add up* locally, and only then all-reduces once and takes one
# optimizer step. Two things are gained:
#
# * **memory**: activations are held for B/k samples at a time, yet the step is the step of batch B;
# * **communication**: one all-reduce per k backward passes instead of one per pass (notebook 05: every all-reduce
#   pays a fixed cost plus the bytes; notebook 01: on small models that is most of a step).
#
# Two details decide whether the result is really the big-batch step:
#
# * **the averaging factor.** Backward passes *add* into the gradient, so each micro-batch's summed loss must be
#   divided by the number of samples in the whole global step — not by its own size, which would weigh k
#   micro-batches k times as much as one batch of the same samples. hvdsync computes this factor in
#   `hvdsync.core.train.scaling.loss_scale`; it is a fixed 1/global-count for averaging, **not** the mixed-precision
#   "loss scale" of notebook 09 (a large, dynamic multiplier that keeps float16 gradients in range);
# * **when to synchronise.** The all-reduce must wait for the last micro-batch: Horovod's
#   `backward_passes_per_step=k`, which hvdsync sets from `sync.accumulate`. Every rank must run the same number of
#   micro-steps, or one rank's all-reduce waits forever (the shard plan guarantees it, notebook 02).
#
# We check the equivalence on 2 Horovod workers, count the all-reduces, and measure what accumulation does to
# throughput.

# %%
import time

import matplotlib.pyplot as plt
import numpy as np

from hvdsync import launch
from hvdsync.config import Config
from hvdsync.torch import loss_scale

cfg = Config().replace(train={"np": 2, "epochs": 2, "seed": 0}, data={"dataset": "digits", "batch_size": 32},
                       tracking={"enabled": False})
print(f"SGD with momentum {cfg.train.momentum}, lr {cfg.train.lr}; {cfg.train.np} workers x {cfg.data.batch_size} "
      f"samples per step")

# %% [markdown]
# ## 1 · The averaging factor (hvdsync's `loss_scale`, not fp16's loss scale)
#
# With 2 workers × 32 samples a step holds 64 samples. Whatever the number of micro-batches, every micro-batch's
# summed loss is multiplied by the same factor; Horovod's `average` then divides the sum over ranks by 2, which the
# factor undoes, so the final gradient is the mean over the 64 samples.

# %%
G = cfg.train.np * cfg.data.batch_size
right = loss_scale(G, cfg.train.np, "average")
print(f"loss_scale(global_count={G}, world_size={cfg.train.np}, op='average') = {right} = {cfg.train.np}/{G}")
for k in (1, 2, 4, 8):
    micro = cfg.data.batch_size // k
    wrong = 1 / micro   # the common bug: scale each micro-batch by its own mean
    print(f"accumulate={k}: {k} micro-batch(es) of {micro}, each scaled by {right:.5f}; scaling each by 1/{micro} "
          f"(its own mean) would make the gradient {wrong / right:.0f}x too large")

# %% [markdown]
# ## 2 · Same steps, fewer all-reduces
#
# One `launch.run` trains the same model from the same start four times, with `sync.accumulate` = 1, 2, 4 and 8 and
# the same 32 samples per worker per step (so micro-batches of 32, 16, 8 and 4). Each run returns its final
# parameters and hvdsync's counters: `optimizer_steps`, `backward_passes`, and `allreduce_rounds` (tensors handed
# to Horovod divided by the gradient tensors per round, counted by hvdsync's compressor hook).

# %%
def accumulation_runs(cfg_dict, ks):
    import hvdsync.torch as ht
    from hvdsync.config import Config
    from hvdsync import datasets
    from hvdsync.fitting import fit_loop

    base = Config.from_dict(cfg_dict)
    data = datasets.load(base.data, base.train.seed)
    out = []
    for k in ks:
        cfg = base.replace(sync={"accumulate": k})
        ht.init(cfg)                      # re-seeds torch: every run builds the same initial model
        backend = ht.build(cfg, data)
        initial = [p.copy() for p in backend.parameters()]
        result = fit_loop(cfg, backend, data)
        out.append({"k": k, "initial": initial, "params": [p.copy() for p in backend.parameters()],
                    "result": result.to_dict()})
    return out


KS = [1, 2, 4, 8]
start = time.perf_counter()
runs = launch.run(accumulation_runs, args=(cfg.to_dict(), KS), np=cfg.train.np, sync=cfg.sync, progress=False)
print(f"2 Horovod workers trained {len(KS)} models in {time.perf_counter() - start:.1f} s (start-up included)")

# %%
rank0 = runs[0]
reference = rank0[0]["params"]
print(" k | max |θ_k − θ_1| | backward passes | optimizer steps | all-reduce rounds | MB to all-reduce "
      "| test acc. | ranks equal")
diffs = []
for run in rank0:
    r = run["result"]
    diffs.append(max(float(np.abs(a - b).max()) for a, b in zip(run["params"], reference)))
    print(f"{run['k']:>2} | {diffs[-1]:>14.2e} | {r['backward_passes']:>15} | {r['optimizer_steps']:>15} | "
          f"{r['allreduce_rounds']:>17.0f} | {r['wire']['bytes'] / 1e6:>16.2f} | {r['test_accuracy']:>9.4f} | "
          f"{r['param_spread'] == 0.0}")
    assert r["allreduce_rounds"] == r["optimizer_steps"], "one all-reduce per optimizer step"
    assert r["backward_passes"] == run["k"] * r["optimizer_steps"], "k backward passes per optimizer step"
    assert r["param_spread"] == 0.0, "both ranks hold the same model"
assert max(diffs) < 1e-5, "accumulate=k of B must take the steps of batch B (up to float32 rounding)"
assert len({run["result"]["wire"]["bytes"] for run in rank0}) == 1, "the bytes to all-reduce do not grow with k"
assert all(np.array_equal(a, b) for run in rank0 for a, b in zip(run["initial"], rank0[0]["initial"]))
moved = max(float(np.abs(a - b).max()) for a, b in zip(reference, rank0[0]["initial"]))
print(f"largest difference to the unaccumulated run: {max(diffs):.2e}, while training moved the parameters by up "
      f"to {moved:.2e} (the difference is float32 rounding: the same terms added in a different order)")

fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.5))
x = np.arange(len(KS))
a1.bar(x - 0.2, [run["result"]["backward_passes"] for run in rank0], width=0.4, label="backward passes")
a1.bar(x + 0.2, [run["result"]["allreduce_rounds"] for run in rank0], width=0.4, label="all-reduce rounds")
a1.set_xticks(x, [f"k={k}\n(micro {cfg.data.batch_size // k})" for k in KS])
a1.set_ylabel(f"count over {cfg.train.epochs} epochs (rank 0)")
a1.set_title("Accumulation: more passes, the same all-reduces")
a1.legend(fontsize=8)
a2.bar([f"k={k}" for k in KS[1:]], diffs[1:], color="tab:purple", label="max |θ_k − θ_1| after training")
a2.axhline(moved, color="grey", ls="--", lw=0.8, label="max |θ_1 − θ_start| (how far training moved)")
a2.axhline(np.finfo(np.float32).eps, color="k", ls=":", lw=0.8, label="float32 machine epsilon")
a2.set_yscale("log")
a2.set_ylim(1e-9, 10)
a2.set_ylabel("max abs parameter difference")
a2.set_title("Final parameters: accumulate=k vs k=1")
a2.legend(fontsize=7, loc="center right")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 3 · Throughput
#
# Now the communication side. Suppose memory allows 8 samples per worker at a time. Two trainings, one after the
# other in one job of workers (`hvdsync.launch.local.train_many`: the training of `hvdsync train`, one Horovod
# start-up for both), with the 2 epochs used above:
#
# * **batch 8**: what fits, without accumulation — one all-reduce per 8 samples per worker;
# * **batch 32 as 4 × 8**: accumulation, same memory — one all-reduce per 32 samples;
#
# and, for reference, the k = 1 run of section 2: **batch 32** without accumulation (4× the activation memory).
#
# The throughput is each run's samples/s in its last epoch: the first training of a job also pays the job's
# warm-up (its first all-reduces), and batch 8 and batch 32 are the first of theirs.

# %%
variants = {
    "batch 8\n(no accumulation)": {"data": {"batch_size": 8}, "sync": {"accumulate": 1}},
    "batch 32 = 4 x 8\n(accumulate=4)": {"data": {"batch_size": 32}, "sync": {"accumulate": 4}},
}
start = time.perf_counter()
results = dict(zip(variants, launch.train_many([cfg.replace(**change) for change in variants.values()])))
print(f"{len(variants)} trainings in one job: launched and trained in {time.perf_counter() - start:.1f} s")
results["batch 32\n(no accumulation)"] = rank0[0]["result"]   # section 2's k=1 run: same epochs, same data
throughput = {label: r["history"][-1]["samples_per_second"] for label, r in results.items()}   # last epoch
small_tp, accumulated_tp, big_tp = throughput.values()   # batch 8, 4 x 8 accumulated, batch 32
for label, r in results.items():
    print(f"{label.replace(chr(10), ' '):<34} {throughput[label]:>6.0f} samples/s (last epoch), "
          f"{r['allreduce_rounds'] / r['epochs']:>3.0f} all-reduces per epoch, test accuracy {r['test_accuracy']:.4f}")
small, accumulated = results["batch 8\n(no accumulation)"], results["batch 32 = 4 x 8\n(accumulate=4)"]
# 1,348 samples: ceil(1348 / 16) = 85 steps per epoch with batch 8, ceil(1348 / 64) = 22 with batch 32.
assert small["allreduce_rounds"] == small["optimizer_steps"] == 85 * small["epochs"]
assert accumulated["allreduce_rounds"] == accumulated["optimizer_steps"] == 22 * accumulated["epochs"]
big = results["batch 32\n(no accumulation)"]
print(f"accumulation: {small['allreduce_rounds'] / accumulated['allreduce_rounds']:.1f}x fewer all-reduces; in this "
      f"run {accumulated_tp / small_tp:.2f}x the throughput of batch 8 and {accumulated_tp / big_tp:.2f}x that of "
      f"batch 32 (last epochs)")
# Not asserted: the three trainings ran one after the other (batch 32 in section 2's job), on cores other jobs may
# share, so their throughputs are this run's numbers, not a measured ratio (benchmarks/ compare side by side).

fig, ax = plt.subplots(figsize=(7.5, 3.5))
labels = list(results)
bars = ax.bar(labels, [throughput[k] for k in labels], color=["tab:grey", "tab:blue", "tab:cyan"])
for bar, k in zip(bars, labels):
    ax.annotate(f"{results[k]['allreduce_rounds'] / results[k]['epochs']:.0f} all-reduces/epoch",
                (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=8)
ax.set_ylabel("samples/s in the last epoch (2 workers)")
ax.set_title("Throughput with and without gradient accumulation")
plt.show()

# %% [markdown]
# ## 4 · Memory: what a step holds for its backward pass
#
# Between a forward pass and its backward, autograd keeps every tensor the backward will need: the layers' inputs
# and outputs (the *activations*), which grow with the batch. `hvdlab.torch.passes.saved_bytes` counts them as they
# are saved (`torch.autograd.graph.saved_tensors_hooks`), apart from the model's parameters, which are held anyway.
# Here, in this notebook's own process, on the model and data the workers trained above: one forward and backward of
# batch 32, and the four micro-batches of 8 that accumulation runs instead, each one's graph freed by its backward
# before the next forward starts.
#
# **Predict, then run.** How many times batch 8's activation bytes does batch 32 hold? Write your guess in the
# next cell (a number), then run the one after it.

# %%
my_prediction = None   # your guess, e.g. 2.0

# %%
import torch

from hvdlab.torch.passes import saved_bytes
from hvdsync.core.train.data import load_digits
from hvdsync.torch.models import build_mlp

torch.manual_seed(cfg.train.seed)
data = load_digits(cfg.data, seed=cfg.train.seed)
model = build_mlp(cfg, data)
x, y = torch.as_tensor(data.x_train[:32], dtype=torch.float32), torch.as_tensor(data.y_train[:32], dtype=torch.long)
whole = saved_bytes(model, x, y)
micro = [saved_bytes(model, x[i:i + 8], y[i:i + 8]) for i in range(0, 32, 8)]
peak_micro = max(m["activations"] for m in micro)
ratio = whole["activations"] / peak_micro
print(f"batch 32 in one pass: {whole['activations']:,} bytes of activations held for the backward "
      f"(+ {whole['parameters']:,} bytes of parameters, held anyway)")
print(f"4 x 8 accumulated: at most {peak_micro:,} bytes at a time (each micro-batch's graph is freed by its "
      f"backward); batch 32 holds {ratio:.2f}x that")
print(f"your prediction: {my_prediction}; measured: {ratio:.2f}x" if my_prediction is not None else
      f"measured: {ratio:.2f}x (write a prediction above and run again to compare)")
# Per sample the same tensors are saved (the input, the hidden layer's output, the log-probabilities, the label),
# so the activations scale with the batch: 4x, up to the few bytes a pass saves whatever its batch.
assert abs(ratio - 4) < 0.01 and all(m["activations"] == peak_micro for m in micro)
assert whole["parameters"] == micro[0]["parameters"], "the parameters held do not depend on the batch"

# %% [markdown]
# With this 64-wide model the bytes are tiny; the ratio is what carries over: on a GPU, a model whose activations at
# batch 32 do not fit trains the batch-32 step as 4 × 8 in a quarter of the activation memory, at the price of four
# smaller (less efficient) passes.

# %% [markdown]
# ## What to take away
#
# * **Accumulation computes the big-batch step in pieces.** accumulate = 2, 4, 8 over the same 32 samples per
#   worker gave the parameters of the unaccumulated run to float32 rounding, after the whole training — because
#   every micro-batch's loss is scaled by the *global* sample count and the all-reduce waits for the last
#   micro-batch.
# * **It all-reduces once per optimizer step, not once per backward pass.** The counters show k backward passes per
#   all-reduce round, and the bytes handed to Horovod do not grow with k.
# * **Fewer all-reduces per sample.** With the memory of batch 8, the accumulated batch of 32 all-reduced 4x less
#   often than batch 8 (counted and asserted: 22 against 85 rounds per epoch). Where communication dominates a
#   step that is more throughput; in this run the throughputs are the ones printed in section 3 (one after the
#   other, on shared cores: not a measured ratio).
#   The price is the optimisation itself: a bigger global batch means fewer steps per epoch, which may need a
#   larger learning rate or more epochs (`train.lr_scaling`).
# * **It holds a micro-batch's activations, not the batch's.** Measured in §4: batch 32 in one pass held 4.00x the
#   activation bytes of the largest of its 4 micro-batches of 8; the parameters held are the same.
