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
# # 16 · 十六、构建可复现的同步训练实验环境 — Building a reproducible experimental environment for synchronous training
#
# > **The guide's section, point by point** (its own points in its order, translated; after each arrow: where this
# > notebook shows it with running code, or why it cannot here):
# >
# > 1. Reproducibility is the foundation of science; parallel randomness makes it take extra steps. → §1: a
# >    deterministic run twice, bitwise equal.
# > 2. Fix the random seeds at every level: the framework, the language's own generator, and random operations tied to
# >    the hardware. → §1: seeds, threads and what each changes; §3 what the record keeps.
# > 3. In distributed training, derive each process's seed correctly from the global seed. → notebook 02 §3
# >    (`rank_seed`); §2 here: what the world size changes.
# > 4. Force non-deterministic algorithms, such as some GPU kernels, into deterministic mode. → §4:
# >    `torch.use_deterministic_algorithms` on the CPU; the GPU branch runs only where a GPU is present.
# > 5. Record every environment setting, library version and launch command. → §3: the run's record read back and
# >    `runs reproduce` bitwise identical.
#
# A run is reproducible when running it again gives **the same bits**: the same parameters, the same metrics.
# That is worth having: a bug report can be replayed, a change's effect is not lost in run-to-run noise, and two
# runs that should agree but do not point at a real difference. It needs every source of variation pinned:
#
# * **seeds**: the model's start, the data order, dropout (hvdsync derives them all from `train.seed`, notebook 02);
# * **kernels**: some GPU kernels add in whatever order threads finish (`train.deterministic: true` asks the
#   framework for deterministic ones: `torch.use_deterministic_algorithms`, `CUBLAS_WORKSPACE_CONFIG`,
#   `TF_DETERMINISTIC_OPS`);
# * **threads**: a CPU kernel may split a sum over threads; another thread count, another order;
# * **the world size and the reduction order**: floating-point addition is not associative, so a gradient summed
#   over 2 workers is not bitwise the one summed in 1 process, and an all-reduce over 3 or more ranks adds in an
#   order that depends on how the buffer is cut;
# * and what is outside the code: library versions, how Horovod was built, environment variables.
#
# hvdsync records the last group with every run (`hvdsync/record.json`: seeds, versions, Horovod's build key and
# transports, the command line, the git commit, the relevant environment variables with anything named like a
# secret removed), and `hvdsync runs reproduce RUN_ID` reruns a run from that record and compares the final
# metrics, including a fingerprint of the final parameters.

# %%
import json
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import mlflow
import numpy as np

from hvdsync import launch
from hvdsync.launch import runs
from hvdsync.config import Config

folder = Path(tempfile.mkdtemp(prefix="hvdsync-nb16-"))
store = f"sqlite:///{folder / 'mlflow.db'}"
base = Config().replace(train={"np": 2, "epochs": 1, "deterministic": True}, data={"batch_size": 16},
                        tracking={"tracking_uri": store, "experiment": "nb16", "spool_dir": str(folder / "spool"),
                                  "system_metrics": False, "flush_seconds": 300})
print(f"deterministic={base.train.deterministic}, seed={base.train.seed}, store {store}")


# %% [markdown]
# ## 1 · The same run twice, and what changes it
#
# One pair of workers trains four runs and returns every final parameter: the deterministic config twice, then
# with 2 intra-op threads per worker instead of 1, then with another seed.

# %%
def variants(raw, only_first=False):
    import torch

    from hvdsync.config import Config
    from hvdlab.fitting import fit_with
    from hvdsync.torch import init
    from hvdsync.torch.train import build

    def run(name, threads=None, tracked=False, **changes):
        held = {}

        def build_and_keep(cfg, data):
            if threads:
                torch.set_num_threads(threads)   # after init, which sets one thread per worker here
            held["backend"] = build(cfg, data)
            return held["backend"]

        cfg = Config.from_dict(raw).replace(tracking={"run_name": name, "enabled": tracked}, **changes)
        result = fit_with(init, build_and_keep, cfg).to_dict()
        return {**result, "name": name, "params": [p.copy() for p in held["backend"].parameters()]}

    # Only the first run is recorded in MLflow (section 3 reproduces it from its record).
    if only_first:
        return [run("first")]
    return [run("first", tracked=True), run("again"), run("2 threads", threads=2), run("seed 1", train={"seed": 1})]


out = launch.run(variants, args=(base.to_dict(),), np=2)[0]


def max_diff(a, b):
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a["params"], b["params"]))


def bitwise(a, b):
    return all(x.tobytes() == y.tobytes() for x, y in zip(a["params"], b["params"]))


first = out[0]
for other in out[1:]:
    print(f"{other['name']:10s} vs first: bitwise equal {bitwise(first, other)}, "
          f"largest parameter difference {max_diff(first, other):.3g}")
assert bitwise(first, out[1])                 # the rerun: the same bits
assert not bitwise(first, out[3])             # another seed: another model
assert max_diff(first, out[2]) < 1e-5          # other threads: at most rounding apart, the same maths
print(f"in this run: 2 intra-op threads {'left the bits unchanged' if bitwise(first, out[2]) else 'changed the bits'}"
      f" (largest difference {max_diff(first, out[2]):.3g}); a tiny MLP's kernels may not split their sums at all")

# %% [markdown]
# ## 2 · World size and the order of additions
#
# The same global batch of 32 samples per step, once as 2 workers × 16, once as 1 process × 32: mathematically
# the same steps (notebook 01), numerically not quite, because the gradient's sum is split differently.
#
# **Predict, then run.** After one epoch of the same steps, how far apart will the 1 × 32 run's parameters and the
# 2 × 16 run's be (the largest difference over all parameters; the weights start within ±0.125)? Write your guess
# in the next cell (a number), then run the one after it.

# %%
my_prediction = None   # your guess, e.g. 1e-3

# %%
single = launch.run(variants, args=(base.replace(train={"np": 1}, data={"batch_size": 32}).to_dict(), True), np=1)[0][0]
print(f"1 x 32 vs 2 x 16: bitwise equal {bitwise(first, single)}, largest difference {max_diff(first, single):.3g}")
assert max_diff(first, single) < 1e-5          # the same maths: only float32 rounding apart (notebook 01's bound)
print(f"your prediction: {my_prediction}; measured: {max_diff(first, single):.3g}" if my_prediction is not None else
      f"measured: {max_diff(first, single):.3g} (write a prediction above and run again to compare)")

# %% [markdown]
# Why the bits differ: floating-point addition is not associative. The same 100,000 float32 numbers, summed in
# four orders:

# %%
rng = np.random.default_rng(0)
values = rng.standard_normal(100_000).astype(np.float32)
orders = {"in order": values, "reversed": values[::-1], "shuffled": rng.permutation(values),
          "pairwise (numpy)": None}
sums = {}
for name, v in orders.items():
    if v is None:
        sums[name] = float(np.sum(values))                       # numpy's pairwise summation
    else:
        acc = np.float32(0)
        for chunk in np.split(v, 100):                             # 100 partial sums, then added in sequence
            acc = np.float32(acc + np.float32(chunk.sum(dtype=np.float32)))
        sums[name] = float(acc)
exact = float(np.sum(values.astype(np.float64)))
for name, s in sums.items():
    print(f"float32 sum {name:17s} {s:.9g} (error vs float64 {s - exact:+.2e})")
print(f"{len(set(sums.values()))} different float32 results from the same 100,000 numbers")
assert len(set(sums.values())) > 1, "another order of addition, another float32"

fig, axes = plt.subplots(1, 2, figsize=(12, 3.6))
names = [o["name"] for o in out[1:]] + ["1 x 32"]
diffs = [max_diff(first, o) for o in out[1:]] + [max_diff(first, single)]
axes[0].bar(names, [max(d, 1e-12) for d in diffs])
axes[0].set(yscale="log", title="largest parameter difference from the first run (1e-12 = none)")
axes[1].bar(list(sums), [s - exact for s in sums.values()])
axes[1].set(title="float32 sum minus the float64 sum, by order of addition")
plt.setp(axes[1].get_xticklabels(), rotation=15)
plt.tight_layout()
plt.show()
assert not bitwise(first, single) and max_diff(first, single) < 1e-4  # not the same bits, the same training

# %% [markdown]
# ## 3 · The record, and `runs reproduce`
#
# What the first run recorded, read back from MLflow; then `hvdsync.launch.runs.reproduce` (the function behind
# `hvdsync runs reproduce RUN_ID`) starts a fresh pair of workers from the record alone and compares.

# %%
client = mlflow.MlflowClient(store)
record = json.loads(Path(client.download_artifacts(first["run_id"], "hvdsync/record.json", str(folder))).read_text())
print("seeds:", record["seeds"])
print("versions:", {k: record["versions"][k] for k in ("python", "torch", "horovod", "mlflow") if k in record["versions"]})
print("horovod build:", {k: v for k, v in record["horovod_build"].items() if k != "build_key"})
print("environment recorded:", ", ".join(sorted(record["env"])[:12]), "...")
again = runs.reproduce(first["run_id"], store)
for name, (was, now) in again["metrics"].items():
    print(f"{name:28s} recorded {was!r:24} rerun {now!r:24} {'equal' if was == now else 'DIFFERENT'}")
assert again["identical"]

# %% [markdown]
# ## 4 · Deterministic kernels
#
# `train.deterministic: true` makes hvdsync set `CUBLAS_WORKSPACE_CONFIG` and `TF_DETERMINISTIC_OPS` before the
# framework starts (`hvdsync.core.train.seeding.DETERMINISTIC_ENV`), call `torch.use_deterministic_algorithms(True)`
# in a PyTorch worker and `tf.config.experimental.enable_op_determinism()` in a TensorFlow one. On a CPU the kernels
# used here are deterministic anyway; on a GPU, kernels that accumulate with atomic additions (`index_add_`,
# `scatter_add_`, some convolution backward passes) add in whatever order threads finish. The cell below runs an
# `index_add_` with many repeated indices five times with the switch off and five times with it on. Its CPU part
# runs everywhere; the GPU part runs only where `torch.cuda.is_available()`, and it says so when it did not run.

# %%
import torch

from hvdsync.core.train import seeding

print("hvdsync sets before the framework starts:", seeding.DETERMINISTIC_ENV)


def distinct_results(device, repeats=5):
    """How many different results the same index_add_ gives when run `repeats` times."""
    gen = torch.Generator().manual_seed(0)
    index = torch.randint(0, 100, (1_000_000,), generator=gen).to(device)
    values = torch.randn(1_000_000, generator=gen).to(device)
    results = {torch.zeros(100, device=device).index_add_(0, index, values).cpu().numpy().tobytes()
               for _ in range(repeats)}
    return len(results)


was = torch.are_deterministic_algorithms_enabled()
devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
counts = {}
try:
    for flag in (False, True):
        torch.use_deterministic_algorithms(flag)
        for device in devices:
            counts[device, flag] = distinct_results(device)
            print(f"{device:4} deterministic={flag!s:5}: {counts[device, flag]} distinct result(s) out of 5 runs")
finally:
    torch.use_deterministic_algorithms(was)
assert counts["cpu", False] == counts["cpu", True] == 1, "the CPU kernel adds in one order"
if "cuda" in devices:
    assert counts["cuda", True] == 1, "deterministic kernels: the same bits every time"
else:
    print("in this run: no CUDA device, so the GPU branch did not run (only the CPU part above did)")

fig, ax = plt.subplots(figsize=(6, 3))
labels = [f"{d}\ndeterministic={f}" for d, f in counts]
ax.bar(labels, list(counts.values()), color=["tab:blue" if f else "tab:orange" for _, f in counts])
ax.set(ylabel="distinct results in 5 runs", title="index_add_ with repeated indices", ylim=(0, 5.5))
plt.tight_layout()
plt.show()

# %% [markdown]
# ## What to take away
#
# * With the seeds pinned, `train.deterministic: true`, the same thread count and the same world size, a rerun
#   of a PyTorch job is bitwise identical (asserted in section 1), and `hvdsync runs reproduce` checks it from the
#   run's record (asserted in section 3).
# * Change the world size and the bits change though the maths does not (1 × 32 vs 2 × 16: not bitwise equal,
#   less than 1e-5 apart, asserted in section 2). Another thread count stays within 1e-5 too (asserted); whether it
#   changes the bits depends on the kernels (in this run: printed in section 1). Decide which reproducibility you
#   need: bitwise (same everything) or statistical (same curves within noise).
# * Floating-point addition is not associative: the same numbers summed in another order gave other float32
#   results (asserted in section 2). Every all-reduce is such a sum; with 3 or more ranks its order depends on how
#   Horovod cuts the buffer.
# * On a GPU, ask for deterministic kernels: section 4's CPU kernel gave one result every time (asserted); its GPU
#   branch checks the same on CUDA where a GPU is present (in this run it printed whether it ran).
# * Keep the record with the run (versions, Horovod build, environment, command line, commit): when a rerun
#   differs, the record says what changed; secrets never belong in it.
