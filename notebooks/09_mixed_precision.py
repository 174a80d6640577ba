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
# # 09 · 九、利用混合精度训练加速同步过程 — Using mixed-precision training to speed up synchronisation
#
# > **The guide's section, point by point** (its own points in its order, translated; after each arrow: where this
# > notebook shows it with running code, or why it cannot here):
# >
# > 1. Mixed precision computes in single and half precision together: faster compute, less GPU memory, and a faster
# >    synchronisation as well. → §2: fp32, fp16 and bf16 trained on 2 workers; on this CPU 16-bit maths is emulated,
# >    so §3 prints its time and claims nothing; §5 measures the memory: the bytes held for the backward pass.
# > 2. Gradients sent in half instead of single precision are half the data, and the communication time drops with it.
# >    → §3: `sync.compression: fp16` hands 0.500x fp32's bytes to the all-reduce (counted, asserted).
# > 3. The catch: half precision's narrow range can make gradients underflow and training unstable. → §1: round-trip
# >    error of both 16-bit formats from 1e-10 to 1e6.
# > 4. The answer: loss scaling, with careful precision conversion and scale management before and after the
# >    synchronisation. → §2 a dynamic loss scale; §4 one rank overflowing, before or after the exchange: the ranks
# >    skip together with hvdsync.
# > 5. Where bandwidth bounds the synchronisation, mixed precision usually brings a clear end-to-end speed-up. → no
# >    bandwidth-bound link here: notebook 03 §3's recorded run at 100 Mbit/s stands in (fp16 step 0.51x fp32's).
#
# Mixed precision runs the forward and backward passes in a 16-bit float (half the memory traffic, and on GPUs
# tensor cores) while the parameters and the update stay in float32. Two 16-bit formats compete:
#
# * **float16**: 5 exponent bits, 10 mantissa bits. Fine rounding, but a narrow range: the largest value is
#   65,504 and values below ~6e-5 lose precision (below ~6e-8 they become 0). Small gradients *underflow*, so the
#   loss is multiplied by a **loss scale** (in this notebook always this large, dynamic fp16 multiplier, `GradScaler`'s
#   scale; not the fixed 1/global-count averaging factor of notebook 06, which hvdsync's code calls `loss_scale` and
#   which is named `mean_factor` below) before the backward pass (the gradients move up into range) and the
#   gradients are divided by it before the update. Too large a scale *overflows* to inf; so the scale is
#   **dynamic**: a step whose gradients hold an inf or nan is skipped and the scale halved; after a run of good
#   steps it is doubled (PyTorch's `GradScaler`, Keras' `LossScaleOptimizer`).
# * **bfloat16**: 8 exponent bits (float32's range), 7 mantissa bits. Every normal float32 (down to ~1.2e-38) stays
#   in range, so gradients do not underflow and no loss scale is needed; it rounds more coarsely. Only float32's
#   subnormals lose out: bfloat16's smallest positive value is 2**-133 (~9.2e-41), and a float32 at or below half of
#   it, 2**-134 (~4.6e-41), becomes 0 (computed in §1).
#
# With several workers one more thing matters: **the skip must be the same on every rank**. Usually it is by
# itself: an inf in one rank's gradient *before* the all-reduce is summed into every rank's gradient, so every
# rank's `GradScaler` sees it and skips (§4 measures this). It is not when a non-finite value reaches one rank only,
# *after* the exchange (that rank's own post-processing, or an exchange that does not carry it, such as a codec
# that drops or clamps it): that rank skips while the other steps, and the two hold different models from then on —
# silently. hvdsync all-reduces the decision ("did any rank overflow?") before stepping, in both frameworks
# (`train.precision: fp16`; `hvdsync/torch/precision.py`, `hvdsync/tensorflow/precision.py`), so the case is
# covered whichever way the inf arrives.

# %%
import time

import matplotlib.pyplot as plt
import ml_dtypes
import numpy as np

from hvdsync import launch
from hvdsync.config import Config
from hvdsync.torch import StepSpread
from hvdsync.core.train.precision import format_facts

facts = format_facts()
for name, f in facts.items():
    print(f"{name:<9} largest {f['max']:.4g}   smallest normal {f['tiny']:.4g}   machine epsilon {f['eps']:.4g}")

# %% [markdown]
# ## 1 · Range and rounding of the two formats
#
# Every number from 1e-10 to 1e6 stored in float16 and in bfloat16, and read back: the relative error. float16
# is ~8× finer inside its range, and useless outside it (flush to 0 below, inf above); bfloat16 covers all of it.

# %%
x = np.logspace(-10, 6, 2000).astype(np.float32)
with np.errstate(over="ignore"):
    err16 = np.abs(x.astype(np.float16).astype(np.float32) - x) / x
errbf = np.abs(x.astype(ml_dtypes.bfloat16).astype(np.float32) - x) / x
fig, ax = plt.subplots(figsize=(8, 3.5))
ax.loglog(x, np.clip(err16, 1e-6, 2), label="float16")
ax.loglog(x, np.clip(errbf, 1e-6, 2), label="bfloat16")
ax.axvline(facts["float16"]["tiny"], color="tab:blue", ls=":", lw=0.8, label="float16 smallest normal")
ax.axvline(facts["float16"]["max"], color="tab:blue", ls="--", lw=0.8, label="float16 largest")
ax.set_xlabel("value")
ax.set_ylabel("relative error after a round trip")
ax.set_title("float16 vs bfloat16: precision inside the range, and the range")
ax.legend(fontsize=8)
plt.show()
inside = (x > 1e-3) & (x < 1e3)
print(f"median relative error in [1e-3, 1e3]: float16 {np.median(err16[inside]):.2e}, "
      f"bfloat16 {np.median(errbf[inside]):.2e}; values below 6e-8 in float16: "
      f"{np.mean(x[x < 5.9e-8].astype(np.float16) == 0):.0%} become 0")
finer = np.median(errbf[inside]) / np.median(err16[inside])
print(f"float16 rounds {finer:.1f}x more finely than bfloat16 inside the range (3 mantissa bits more: 2**3 = 8)")
assert 6 < finer < 10
# Where bfloat16 does lose what float32 keeps: below float32's normal range. torch's conversion rounds to nearest
# (ties to even): the smallest positive bfloat16 is 2**-133, and float32 values up to half of it become 0.
import torch

smallest_bf16 = torch.tensor(2.0**-133).to(torch.bfloat16)
half_of_it = torch.tensor(2.0**-134, dtype=torch.float32)
just_above = torch.nextafter(half_of_it, torch.tensor(1.0))
to_bf16 = [float(v.to(torch.bfloat16)) for v in (half_of_it, just_above)]
print(f"bfloat16's smallest positive value {float(smallest_bf16):.3e}; float32 {float(half_of_it):.4e} -> "
      f"{to_bf16[0]:g}, the next float32 up {float(just_above):.4e} -> {to_bf16[1]:.3e}")
assert float(smallest_bf16) == 2.0**-133 > 0 and to_bf16 == [0.0, 2.0**-133]
assert float(torch.tensor(2.0**-133 / 2**4).to(torch.bfloat16)) == 0.0 < 2.0**-133 / 2**4   # float32 keeps it

# %% [markdown]
# ## 2 · Training on 2 workers: fp32, fp16 with a loss scale, bf16
#
# The same digits training three times in one worker job (`launch.train_many`), with `train.precision` =
# fp32, fp16 and bf16 (PyTorch `autocast`; on this CPU the 16-bit maths is emulated, so this shows correctness,
# not speed). `skipped_steps` counts steps skipped for an overflow.

# %%
base = Config.from_dict({"train": {"np": 2, "epochs": 3}, "tracking": {"enabled": False}})
start = time.perf_counter()
# The fourth run also sends its gradients as float16 (`sync.compression: fp16`), for §3.
runs = launch.train_many([base.replace(train={"precision": p}) for p in ("fp32", "fp16", "bf16")]
                         + [base.replace(train={"precision": "fp16"}, sync={"compression": "fp16"})],
                         callbacks=[StepSpread()])   # every rank's parameters compared after every step
print(f"{len(runs)} trainings in {time.perf_counter() - start:.0f} s")
for r in runs:
    print(f"{r['config']['train']['precision']} (wire {r['config']['sync']['compression']}): test accuracy "
          f"{r['test_accuracy']:.4f}, skipped steps "
          f"{r['skipped_steps']}, ranks identical after every step: {r['step_spread_max'] == 0.0}")
    assert r["step_spread_max"] == 0.0
assert all(abs(r["test_accuracy"] - runs[0]["test_accuracy"]) < 0.02 for r in runs)

# %% [markdown]
# ## 3 · What 16 bits buy: bytes on the wire and time per step
#
# `train.precision: fp16` computes in 16 bits, but the gradients it hands to the all-reduce belong to the float32
# master weights: still 4 bytes each. Halving the traffic takes a 16-bit *wire* as well (`sync.compression: fp16`,
# the fourth run). Bytes are counted where hvdsync hands tensors to Horovod; times are each run's phase timers per
# optimizer step (compute = forward and backward, sync wait = the all-reduce), from the runs above, side by side.
# This 2-core CPU has no 16-bit matrix units, loopback moves bytes almost for free, and the runs ran one after
# the other on a shared machine (fp32 first, with the job's warm-up): the byte count is the measurement to trust
# here, the times hold for this run only. The speed gain proper needs a GPU's tensor cores and a real network.

# %%
fp32, fp16, bf16, fp16_wire = runs
print(f"{'run':<22} {'MB to all-reduce':>16} {'wire dtypes':>12} {'compute ms/step':>16} {'sync wait ms/step':>18}")
for name, r in (("fp32", fp32), ("fp16", fp16), ("bf16", bf16), ("fp16 + fp16 wire", fp16_wire)):
    per_step = {k: 1e3 * v / r["optimizer_steps"] for k, v in r["phase_seconds"].items()}
    print(f"{name:<22} {r['wire']['bytes'] / 1e6:16.3f} {','.join(r['wire'].get('dtypes', [])):>12} "
          f"{per_step.get('compute', 0):16.2f} {per_step.get('sync_wait', 0):18.2f}")
wire_ratio = fp16_wire["wire"]["bytes"] / fp32["wire"]["bytes"]
compute_ratio = fp16["phase_seconds"]["compute"] / fp32["phase_seconds"]["compute"]
wait_ratio = fp16_wire["phase_seconds"]["sync_wait"] / fp16["phase_seconds"]["sync_wait"]
print(f"bytes on the wire, fp16 wire / fp32: {wire_ratio:.3f}; fp16 precision alone: "
      f"{fp16['wire']['bytes'] / fp32['wire']['bytes']:.3f}")
print(f"in this run: fp16 compute took {compute_ratio:.2f}x fp32's time per step, and the "
      f"fp16 wire's all-reduce wait {wait_ratio:.2f}x the fp32 wire's")
assert abs(wire_ratio - 0.5) < 0.01, "a 16-bit wire halves the bytes (counted)"
assert fp16["wire"]["bytes"] == fp32["wire"]["bytes"], "fp16 compute alone still sends float32 gradients"

# %% [markdown]
# ## 4 · One rank overflows
#
# Each worker builds the fp16 model, and at step 3 only rank 0 overflows, in one of two places:
#
# * **before the all-reduce**: rank 0's loss is multiplied by inf for its last micro-batch, so its backward produces
#   non-finite gradients, as a real fp16 overflow in backward does. With **the naive recipe** (Horovod +
#   `GradScaler` as in single-process code: synchronize, `scaler.step`, `scaler.update`, each rank deciding alone)
#   the all-reduce carries the inf to rank 1, both ranks skip and halve their scale, and the models stay equal;
# * **after the all-reduce**: rank 0's reduced gradient is made non-finite, standing in for a non-finite value that
#   reaches one rank only. The lab does it from outside (`hvdlab.torch.overflow.after_reduce` wraps this one
#   optimizer's `synchronize`, the call that waits for the all-reduce; hvdsync has no switch for it), the same way
#   for both recipes. **hvdsync** (`MixedPrecision.step`): both ranks skip step 3 and halve the scale. **The naive
#   recipe**: rank 0 skips, rank 1 steps — and the models part ways.

# %%
def overflow_demo(steps=8, at=3):
    import horovod.torch as hvd
    import torch

    import hvdsync.torch as ht
    from hvdlab.torch.overflow import after_reduce
    from hvdsync.config import Config
    from hvdsync import datasets
    from hvdsync.core.telemetry import monitor
    from hvdsync.torch import loss_scale, ShardPlan

    cfg = Config.from_dict({"train": {"precision": "fp16"}, "tracking": {"enabled": False}})
    out = {}
    for recipe in ("hvdsync", "naive, inf before", "naive"):
        ht.init(cfg)
        data = datasets.load(cfg.data, cfg.train.seed)
        backend = ht.build(cfg, data)
        mp, opt = backend.precision, backend.optimizer
        overflow = after_reduce(backend)  # armed below on rank 0 only: its reduced gradient turns inf
        plan = ShardPlan(len(data.x_train), hvd.size(), cfg.data.batch_size, 1, cfg.train.seed)
        rows = []
        for i, step in enumerate(plan.epoch(0, hvd.rank())[:steps]):
            micro = [(data.x_train[m], data.y_train[m]) for m in step.micro]
            # 1/global-count: makes the summed losses a global mean (notebook 06); not the fp16 loss scale.
            mean_factor = loss_scale(step.global_count, hvd.size(), "average")
            overflow_here = i == at and hvd.rank() == 0
            if overflow_here and recipe != "naive, inf before":
                overflow.arm()
            if recipe == "hvdsync":
                backend.train_step(micro, mean_factor)
            else:
                opt.zero_grad()
                for j, (x, y) in enumerate(micro):
                    with mp.autocast():
                        loss = torch.nn.functional.cross_entropy(backend.model(torch.as_tensor(x)),
                                                                 torch.as_tensor(y), reduction="sum")
                    if overflow_here and recipe == "naive, inf before" and j == len(micro) - 1:
                        loss = loss * float("inf")    # rank 0's backward overflows, before any exchange
                    mp.backward(loss * mean_factor)
                opt.synchronize()                    # (armed: rank 0's reduced gradient is inf after it)
                mp.scaler.unscale_(opt)
                with opt.skip_synchronize():
                    mp.scaler.step(opt)          # each rank decides from its own gradients
                mp.scaler.update()
            spread = monitor.spread(backend.allgather(monitor.fingerprint(backend.parameters())))
            rows.append({"scale": mp.scale, "spread": spread})
        out[recipe] = rows
    return out


demo = launch.run(overflow_demo, np=2, progress=False)
for recipe in ("hvdsync", "naive, inf before", "naive"):
    print(recipe)
    for i, (r0, r1) in enumerate(zip(demo[0][recipe], demo[1][recipe])):
        print(f"  step {i}: scale rank 0 {r0['scale']:>8.0f}, rank 1 {r1['scale']:>8.0f}; "
              f"parameter spread across ranks {r0['spread']:.3g}")
good, naive = demo[0]["hvdsync"], demo[0]["naive"]
assert all(r["spread"] == 0.0 for r in good), "hvdsync: identical ranks after every step"
assert [r["scale"] for r in demo[0]["hvdsync"]] == [r["scale"] for r in demo[1]["hvdsync"]]
assert good[3]["scale"] == good[2]["scale"] / 2, "the scale was halved on both ranks"
assert naive[-1]["spread"] > 0, "the naive recipe, inf after the exchange on one rank: the ranks diverge"
before = [demo[rank]["naive, inf before"] for rank in (0, 1)]
assert all(r["spread"] == 0.0 for r in before[0]), "an inf before the all-reduce reaches both ranks: no divergence"
assert before[0][3]["scale"] == before[1][3]["scale"] == before[0][2]["scale"] / 2, "both GradScalers skipped"

fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.5))
steps = range(len(good))
for recipe, style in (("hvdsync", "-o"), ("naive, inf before", ":s"), ("naive", "--x")):
    for rank in (0, 1):
        a1.plot(steps, [r["scale"] for r in demo[rank][recipe]], style, label=f"{recipe}, rank {rank}")
    a2.plot(steps, [max(r["spread"], 1e-12) for r in demo[0][recipe]], style, label=recipe)
a1.set_yscale("log", base=2)
a1.set_xlabel("step")
a1.set_ylabel("loss scale")
a1.set_title("Rank 0 overflows at step 3 (naive: inf after the exchange)")
a1.legend(fontsize=7)
a2.set_yscale("log")
a2.set_xlabel("step")
a2.set_ylabel("parameter spread across ranks (1e-12 = identical)")
a2.set_title("Do the ranks still hold one model?")
a2.legend(fontsize=8)
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 5 · Memory: what 16-bit compute holds for the backward pass
#
# "Less GPU memory" means the activations: under `autocast` the layers' inputs and outputs that autograd keeps for
# the backward are 16-bit. `hvdlab.torch.passes.saved_bytes` counts what is saved (in this notebook's process, on
# §2's model and data), apart from the float32 parameters, which are held anyway. Autocast also saves 16-bit
# *copies* of the weights it multiplies by: extra bytes whatever the batch. So the saving depends on the batch.
#
# **Predict, then run.** At batch 8, 32 and 256, what fraction of float32's activation bytes does bf16 hold? (A
# pure halving would be 0.5 at every batch.) Write your guesses, then run the cell after.

# %%
my_prediction = None   # your guesses, e.g. {8: 0.5, 32: 0.5, 256: 0.5}

# %%
import torch

from hvdlab.torch.passes import saved_bytes
from hvdsync.core.train.data import load_digits
from hvdsync.torch.models import build_mlp

torch.manual_seed(base.train.seed)
data = load_digits(base.data, seed=base.train.seed)
model = build_mlp(base, data)
held = {}
for n in (8, 32, 256):
    x = torch.as_tensor(data.x_train[:n], dtype=torch.float32)
    y = torch.as_tensor(data.y_train[:n], dtype=torch.long)
    f32, b16 = saved_bytes(model, x, y), saved_bytes(model, x, y, dtype=torch.bfloat16)
    held[n] = b16["activations"] / f32["activations"]
    print(f"batch {n:>3}: float32 {f32['activations']:>7,} bytes; bf16 {b16['activations']:>7,} bytes "
          f"({', '.join(f'{k} {v:,}' for k, v in b16['dtypes'].items())}): {held[n]:.2f}x")
print(f"your prediction: {my_prediction}" if my_prediction is not None else
      "(write a prediction above and run again to compare)")
# The 16-bit copies of the weights are a fixed cost; the log-probabilities stay float32 (autocast runs the softmax
# and the loss in float32) and the labels are int64: the fraction falls towards 0.5 as the batch grows, never below.
assert held[8] > held[32] > held[256] > 0.5
assert held[256] < 0.6, "at a batch where activations dominate, bf16 holds little more than half"

# %% [markdown]
# ## What to take away
#
# * **float16 needs a loss scale, bfloat16 does not.** float16 rounds ~8× more finely but its range ends at
#   65,504 and small values flush to zero; bfloat16 has float32's range. Both trained digits to within 2 points of
#   float32's accuracy here (asserted).
# * **Half the bytes takes a 16-bit wire.** Mixed-precision compute still all-reduces float32 gradients; with
#   `sync.compression: fp16` the bytes handed to the all-reduce halved (counted, asserted). The time gain needs
#   16-bit hardware and a real network: this run's emulated-CPU ratios are printed in §3, not claimed.
# * **The scale is dynamic:** an overflowing step is skipped and the scale halved (asserted in §4, on both ranks);
#   after a run of good steps (`GradScaler`'s growth interval, 2,000 by default) it doubles, which these 8 steps
#   do not reach.
# * **With several ranks, skip together.** Each rank's `GradScaler` (or `LossScaleOptimizer`) decides from its own
#   gradients. An overflow in one rank's backward is carried to every rank by the all-reduce, so even the naive
#   recipe skips on both (asserted in §4). A non-finite value that reaches one rank only, after the exchange, makes
#   the naive ranks diverge for good (asserted in §4); hvdsync all-reduces the decision, so both ranks skipped,
#   halved their scale, and kept identical parameters either way.
# * **Less memory, as the batch grows.** bf16 held a smaller fraction of float32's activation bytes at every larger
#   batch, above one half and under 0.6 at batch 256 (§5, counted and asserted; this run's fractions are printed
#   there): autocast's 16-bit weight copies are a fixed cost, and the loss's float32 tensors stay; a pure halving is
#   the limit, not the figure.
# * **Codecs and loss scaling:** with top-k, int8 or PowerSGD hvdsync skips the codec on an overflowed step (its
#   residuals would take the inf) and runs it on the unscaled gradient, so residuals keep their meaning when the
#   scale changes (checked with a forced overflow on one rank by `tests/parallel/test_codecs.py`, not in this
#   notebook).
