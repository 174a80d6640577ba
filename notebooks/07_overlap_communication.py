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
# # 07 · 七、优化通信与计算的重叠执行 — Optimising the overlapped execution of communication and computation
#
# > **The guide's section, point by point** (its own points in its order, translated; after each arrow: where this
# > notebook shows it with running code, or why it cannot here):
# >
# > 1. Communication time in synchronous training is often pure overhead. → §1: how long the all-reduce runs per step,
# >    from Horovod's timeline.
# > 2. The most effective way to hide it is to overlap communication with computation. → §1: the share hidden behind
# >    backward, Horovod's hooks against an all-reduce after backward.
# > 3. Concretely, gradients can be moved to the communication buffer as soon as they are computed (the guide says
# >    after the forward pass; they appear during backward), while part of the next layer's or the next batch's
# >    computation runs. → §2: per tensor, when each gradient was ready and when it was reduced; §4 the next batch
# >    loaded while the step runs.
# > 4. Frameworks and communication libraries support such asynchronous operations. → §1 Horovod's per-parameter
# >    hooks; §3 hvdsync's default, buckets like DDP's (sizes and DDP's rule read from the installed torch).
# > 5. With careful pipelining, communication can be hidden almost entirely behind computation. → §1 prints the
# >    largest share hidden on its models in this run; §5 builds a model whose every bucket computes longer than it
# >    transfers, and the hooks hide nearly all of the all-reduce (measured on the timeline, asserted), with when
# >    that holds on real hardware.
# > 6. This needs a close understanding of the model's computation graph and of the hardware's data flow. → §2 and §1:
# >    layer order decides when each gradient is ready (asserted on the ready stamps).
#
# Backward computes gradients from the last layer to the first. The last layer's gradient is final long before
# backward is over, so its all-reduce can run *while* the earlier layers are still being differentiated. Horovod's
# `DistributedOptimizer` does exactly that: it registers a hook on every parameter, and the moment a gradient is
# ready the hook hands it to Horovod's background thread, which every `HOROVOD_CYCLE_TIME` fuses what is ready (up
# to `HOROVOD_FUSION_THRESHOLD` bytes) and all-reduces it. Whatever finishes before backward does is **hidden**;
# only the rest shows up as waiting (`sync_wait` in hvdsync's phase timers). hvdsync's PyTorch training uses these
# hooks only for models whose gradients exceed `sync.grouped_mb` (25 MiB by default); smaller ones are all-reduced
# in a few grouped calls, buckets like DDP's, each started when backward has produced its last gradient (section 3).
#
# We measure it with Horovod's own instrument, the **timeline** (`HOROVOD_TIMELINE`: a Chrome trace written by
# rank 0 with, per tensor, negotiation, queueing, the fusion-buffer copies and the all-reduce), parsed by
# `hvdsync.core.telemetry.timeline`. The probe (`hvdlab.torch.overlap.probe`) trains an MLP two ways in one job:
#
# * **hooks**: Horovod's `DistributedOptimizer`;
# * **after backward**: a plain backward, then every gradient handed to Horovod (nothing can overlap);
#
# for two **layer orders** with the same layers (big layers at the output end, ready first; or at the input end,
# ready last), at two **fusion thresholds** (0: every gradient on its own; 64 MiB: fused). The hidden share is the
# part of the time during which an all-reduce was running that fell inside a backward pass.

# %%
import tempfile
import time
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from hvdsync import launch
from hvdsync.config import SyncConfig
from hvdsync.core.telemetry import timeline
from hvdlab.torch import hiding, overlap

folder = Path(tempfile.mkdtemp(prefix="hvdsync-nb07-"))
THRESHOLDS = [0, 64]
LOAD_S = 0.03   # section 4: what loading one batch costs (a sleep standing in for reading and decoding: I/O)
# Section 5: a model built so that each layer's backward takes longer than its gradient's all-reduce
# (hvdlab.torch.hiding.model): four 1024 x 1024 layers (4 MiB each; ~1 GFLOP of backward each at batch 256) after an
# input end with few parameters and much compute (8 -> 1024 on each of 32 positions, averaged).
HIDE = {"batch": 256, "tokens": 32}


def probe_and_more(extra, **kwargs):
    """overlap.probe; then, in the job at the default fusion threshold, sections 3 and 4 (one start-up for all)."""
    rows = overlap.probe(**kwargs)
    if not extra:
        return {"rows": rows}
    hide = hiding.probe(steps=kwargs["steps"], warmup=kwargs["warmup"], **HIDE)
    import time
    from concurrent.futures import ThreadPoolExecutor

    import horovod.torch as hvd
    import torch

    import hvdsync.torch as ht
    from hvdsync.config import SyncConfig
    from hvdsync.torch.grouped import GroupedOptimizer

    widths = overlap.layer_widths("big_last")

    def model_and_optimizer(sync):      # the probe's big_last MLP, from the same seed
        torch.manual_seed(0)
        layers = [m for a, b in zip(widths, widths[1:]) for m in (torch.nn.Linear(a, b), torch.nn.ReLU())][:-1]
        model = torch.nn.Sequential(*layers)
        return model, ht.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=1e-3), model, sync)

    x = torch.randn(kwargs["batch"], widths[0])
    hvdsync_rows = []
    for label, sync in (("default (grouped_mb 25)", SyncConfig()), ("grouped_mb 8", SyncConfig(grouped_mb=8))):
        model, opt = model_and_optimizer(sync)
        windows, steps_s = [], []
        hvd.allreduce(torch.zeros(1), name=f"nb07.{label}.start")
        for i in range(1 + kwargs["steps"]):   # one warm-up step, then the timed ones
            t0 = time.time()
            if i == 1:
                start = t0
            opt.zero_grad()
            loss = model(x).square().mean()
            b0 = time.time()
            loss.backward()
            b1 = time.time()
            opt.step()
            if i:
                windows.append((b0, b1))
                steps_s.append(time.time() - t0)
        end = time.time()
        hvd.allreduce(torch.zeros(1), name=f"nb07.{label}.end")
        # Horovod's DistributedOptimizer is a class made at run time and named after the wrapped one (SGD).
        grouped = isinstance(opt, GroupedOptimizer)
        hvdsync_rows.append({"label": label, "grouped": grouped, "segment": (start, end),
                             "backward": windows, "step_seconds": steps_s,
                             "gradient_mib": sum(p.numel() * 4 for p in model.parameters()) / 2**20})

    small = x[:32]      # a smaller batch keeps these 24 extra steps short

    def load(i):
        time.sleep(LOAD_S)
        return small

    prefetch_rows = {}
    model, opt = model_and_optimizer(SyncConfig())
    with ThreadPoolExecutor(1) as pool:
        for prefetch in (False, True, False, True):     # interleaved: a slow spell of the machine hits both
            ahead = pool.submit(load, 0)
            steps_s, waits_s = [], []
            for i in range(6):
                t0 = time.time()
                if prefetch:
                    batch = ahead.result()
                    ahead = pool.submit(load, i + 1)  # the next batch loads while this one computes and all-reduces
                else:
                    batch = load(i)
                waits_s.append(time.time() - t0)      # how long this step waited for its batch
                opt.zero_grad()
                model(batch).square().mean().backward()
                opt.step()
                steps_s.append(time.time() - t0)
            ahead.result()
            got = prefetch_rows.setdefault(prefetch, {"step": [], "wait": []})
            got["step"] += steps_s[1:]               # the first step waits for its first load either way
            got["wait"] += waits_s[1:]
    return {"rows": rows, "hvdsync": hvdsync_rows, "prefetch": prefetch_rows, "hide": hide}


jobs, extras = {}, {}
start = time.perf_counter()
for mb in THRESHOLDS:
    path = folder / f"timeline-fusion{mb}.json"
    out = launch.run(probe_and_more, args=(mb == 64,), kwargs={"batch": 256, "steps": 4, "warmup": 1}, np=2,
                     sync=SyncConfig(fusion_threshold_mb=mb), env={"HOROVOD_TIMELINE": str(path)},
                     progress=False)[0]
    jobs[mb] = (out["rows"], timeline.read(path))
    extras.update({k: v for k, v in out.items() if k != "rows"})
print(f"2 jobs x 2 orders x 2 variants (and sections 3-5 in the second) in {time.perf_counter() - start:.0f} s; "
      f"widths big_last {overlap.layer_widths('big_last')}, big_first {overlap.layer_widths('big_first')}")

# %% [markdown]
# ## 1 · How much of the all-reduce hides behind backward
#
# The measurement itself is interval arithmetic: merge the all-reduce spans of the timeline into the time during
# which *some* all-reduce was running, merge the backward windows the worker stamped, and divide the length of
# their intersection by the first. Written out here, then checked against the package's
# `hvdsync.core.telemetry.timeline.overlap` on every row.
#
# **Predict, then run.** With Horovod's hooks an all-reduce can start while backward is still computing; after
# backward, none can. Each variant ran four rows (two layer orders, two fusion thresholds). What is the largest share
# of the all-reduce time that falls inside backward with the hooks, and after backward (a fraction between 0 and 1
# for each)? Write your guess in the next cell, then run the one after it.

# %%
my_prediction = None   # your guesses, e.g. {"hooks": 0.5, "after_backward": 0.5}

# %%
def merged(intervals):
    """Sorted, non-overlapping union of (start, end) intervals."""
    out = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def hidden_share(spans, windows):
    """Share of the time some all-reduce was running that fell inside a backward window."""
    busy, compute = merged((s.start, s.end) for s in spans), merged(windows)
    inside = sum(max(0.0, min(b, d) - max(a, c)) for a, b in busy for c, d in compute)
    total = sum(b - a for a, b in busy)
    return inside / total if total else 0.0


table = []
for mb, (rows, tl) in jobs.items():
    for row in rows:
        spans = tl.select(op="ALLREDUCE", name=row["bytes"].__contains__, between=row["segment"])
        assert {s.name for s in spans} == set(row["bytes"]), "every gradient appears in the timeline"
        hidden = hidden_share(spans, row["backward"])
        assert abs(hidden - timeline.overlap(spans, row["backward"])) < 1e-9, "inline and package agree"
        busy = timeline.busy_seconds(spans) / len(row["backward"])
        backward = np.mean([b - a for a, b in row["backward"]])
        table.append((mb, row["order"], row["variant"], hidden, busy, backward, np.median(row["step_seconds"])))
print("fusion | layer order | variant        | hidden | all-reduce busy/step | backward | step (median)")
for mb, order, variant, hidden, busy, backward, step in table:
    print(f"{mb:>3} MiB | {order:11} | {variant:14} | {hidden:6.1%} | {busy * 1e3:12.1f} ms       | "
          f"{backward * 1e3:5.1f} ms | {step * 1e3:6.1f} ms")
assert all(h < 0.05 for _, _, v, h, *_ in table if v == "after_backward")   # nothing can hide there
print("the inline hidden share equals timeline.overlap on all", len(table), "rows")
best = max((h, mb, o) for mb, o, v, h, *_ in table if v == "hooks")
assert best[0] > 0.05, "with the hooks, part of the all-reduce runs during backward"
print(f"in this run: the hooks hid up to {best[0]:.0%} of the all-reduce time ({best[2]}, fusion {best[1]} MiB); "
      f"after backward at most {max(h for _, _, v, h, *_ in table if v == 'after_backward'):.1%}")
# Layer order: backward produces the output end's gradients first. Checked on the worker's ready stamps (every row,
# every step); what that does to the hidden share depends on sizes and timing, so it is printed, not asserted.
for rows, _ in jobs.values():
    for row in rows:
        names = list(row["bytes"])          # model order: the input end first, the output end last
        assert all(out < inp for out, inp in zip(row["ready"][names[-1]], row["ready"][names[0]])), \
            "the output end's gradient is ready before the input end's"
for mb in THRESHOLDS:
    hid = {o: h for m, o, v, h, *_ in table if m == mb and v == "hooks"}
    print(f"in this run, hooks at fusion {mb} MiB: big layers at the output end hid {hid['big_last']:.0%}, "
          f"at the input end {hid['big_first']:.0%}")
largest = {v: max(h for _, _, vv, h, *_ in table if vv == v) for v in ("hooks", "after_backward")}
shown = ", ".join(f"{v} {h:.2f}" for v, h in largest.items())
print(f"your prediction: {my_prediction}; measured: {shown}" if my_prediction is not None else
      f"measured: {shown} (write a prediction above and run again to compare)")

# %%
# answers: my_prediction (the hidden shares, drawn)
fig, ax = plt.subplots(figsize=(9, 3.4))
labels = [f"{o}\n{mb} MiB" for mb in THRESHOLDS for o in ("big_last", "big_first")]
for i, variant in enumerate(overlap.VARIANTS):
    vals = [h for mb in THRESHOLDS for o in ("big_last", "big_first")
            for m, oo, v, h, *_ in table if (m, oo, v) == (mb, o, variant)]
    ax.bar(np.arange(len(labels)) + 0.4 * (i - 0.5), np.array(vals) * 100, 0.4, label=variant)
ax.set_xticks(np.arange(len(labels)), labels)
ax.set_ylabel("all-reduce time hidden (%)"), ax.legend(), ax.set_title("from Horovod's timeline, 2 workers")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 2 · Per tensor: when ready, when reduced
#
# One timed step of each variant (big layers last, no fusion): the grey band is backward, a dot is the moment
# the gradient was ready (a post-accumulate hook in the worker), the bar is its all-reduce in Horovod's timeline
# (epoch-aligned: Horovod writes its start time since the epoch at the top of the file).

# %%
fig, axes = plt.subplots(1, 2, figsize=(12, 3.8), sharey=True)
rows, tl = jobs[0]
for ax, variant in zip(axes, overlap.VARIANTS):
    row = next(r for r in rows if r["order"] == "big_last" and r["variant"] == variant)
    b0, b1 = row["backward"][1]
    step_spans = tl.select(op="ALLREDUCE", name=row["bytes"].__contains__, between=(b0 - 0.05, b1 + 0.5))
    names = list(row["bytes"])[::-1]
    ax.axvspan(0, (b1 - b0) * 1e3, color="0.85", label="backward")
    for y, name in enumerate(names):
        # The first all-reduce of this tensor in the step's window; the window starts 50 ms early because the two
        # clocks (Horovod's timeline, the worker's hooks) are aligned only to within a few ms.
        spans = [s for s in step_spans if s.name == name]
        if spans:
            span = min(spans, key=lambda s: s.start)
            ax.barh(y, (span.end - span.start) * 1e3, left=(span.start - b0) * 1e3, color="tab:blue")
        ready = min(t for t in row["ready"][name] if t >= b0)
        ax.plot((ready - b0) * 1e3, y, "o", color="tab:red", ms=4)
    ax.set_yticks(range(len(names)), [f"{n} ({row['bytes'][n] / 2**20:.2f} MiB)" for n in names], fontsize=7)
    ax.set_xlabel("ms since backward started"), ax.set_title(variant)
axes[0].legend(loc="lower right")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 3 · What hvdsync does by default: grouped all-reduces in buckets like DDP's, for models up to `sync.grouped_mb`
#
# Sections 1 and 2 measured Horovod's hooks. They are **not** what hvdsync's PyTorch training uses for small
# models. `hvdsync.torch.distributed_optimizer` (which `fit` and `build` call) adds up the bytes of the gradients
# that train (`hvdsync.torch.grouped.groups_after_backward`):
#
# * **at most `sync.grouped_mb` MiB (default 25, the size of DDP's later buckets, `bucket_cap_mb`; DDP's first
#   bucket is only 1 MiB, so that its first all-reduce starts early in backward)**: a `GroupedOptimizer`, which cuts
#   the gradients once into buckets like DDP's (in backward order, the first up to 1 MiB, the others up to
#   `sync.grouped_mb`; a tensor larger than that is a bucket of its own) and hands each bucket to Horovod in ONE
#   `hvd.grouped_allreduce` when the last backward pass (of `sync.accumulate`) has produced all its gradients. A step
#   pays Horovod's fixed cost per round (a cycle's wait, the negotiation) once per bucket, two or three times,
#   instead of once per group of hooks; a small model is one bucket, reduced after backward, whose backward is over
#   before a hook's all-reduce could hide behind it, which is why this is the default;
# * **above it, or with `sync.grouped_mb: 0`**: Horovod's `DistributedOptimizer` with its per-parameter hooks,
#   whose all-reduces overlap the rest of backward as in section 1. `sync.op: adasum` and
#   `sync.sparse: allgather` always keep the hooks;
# * codecs that change a gradient's shape (`topk`, `randk`, `int8`, `powersgd`) reduce after backward whatever
#   the size, `sync.mode` other than `allreduce` has its own optimizer, and TensorFlow always reduces in one
#   grouped call.
#
# **Like DDP's, not the same rule.** DDP (from its second iteration, once it has seen the order backward produces the
# gradients) fills a bucket by adding the next tensor and closing the bucket once it has *reached* its cap
# (`torch.distributed._compute_bucket_assignment_by_size`), so a bucket overshoots its cap by up to one tensor.
# hvdsync (`hvdsync.torch.grouped.buckets`) closes the open bucket *before* a tensor that would take it over its cap.
# On the probe's `big_last` model the two differ at once: DDP's first bucket is the output layer's 4 kB bias and its
# 4 MiB weight together, hvdsync's is the bias alone (both rules run on the model below).
#
# The fusion-64 MiB job above also trained the probe's `big_last` model through `distributed_optimizer`, at the
# default and with `grouped_mb: 8` (below this model's gradient size, so the hooks), and the same timeline says
# how much of the all-reduce hid behind backward.

# %%
tl64 = jobs[64][1]
for row in extras["hvdsync"]:
    spans = tl64.select(op="ALLREDUCE", between=row["segment"])
    row["hidden"] = hidden_share(spans, row["backward"])
    kind = "grouped buckets" if row["grouped"] else "Horovod's hooks"
    print(f"{row['label']:24}: {row['gradient_mib']:.1f} MiB of gradients -> {kind:31} hidden {row['hidden']:6.1%}, "
          f"step (median) {np.median(row['step_seconds']) * 1e3:.1f} ms")
default, hooks = extras["hvdsync"]
assert default["gradient_mib"] <= 25 and default["grouped"], "a model under 25 MiB is grouped by default"
assert not hooks["grouped"], "above sync.grouped_mb hvdsync keeps Horovod's hooks"
# big_last's first bucket is the output layer's 4 kB bias (its 4 MiB weight is over 1 MiB: the next bucket). It is
# handed to Horovod during backward, and its span in the timeline, mostly a wait for the other rank to hand it over
# too, counts as hidden. The second bucket, the other 12.6 MiB, is complete only when backward ends: less hides than
# with the hooks, which hand each big weight over as soon as it is computed.
assert default["hidden"] < hooks["hidden"], "the big bucket starts when backward ends: less hides than with hooks"
# The comparison with DDP above, read from the installed torch: its first bucket 1 MiB, the later ones 25 MiB.
import torch.distributed
import torch.nn.parallel.distributed as ddp

print(f"DDP: first bucket {torch.distributed._DEFAULT_FIRST_BUCKET_BYTES / 2**20:g} MiB, later buckets "
      f"{ddp._DEFAULT_BUCKET_CAP_MB} MiB (bucket_cap_mb); hvdsync's sync.grouped_mb {SyncConfig().grouped_mb:g} MiB")
assert torch.distributed._DEFAULT_FIRST_BUCKET_BYTES == 2**20 and ddp._DEFAULT_BUCKET_CAP_MB == SyncConfig().grouped_mb
# Both rules on the big_last model's parameters, in the order backward produces their gradients.
from hvdsync.torch.grouped import buckets

widths = overlap.layer_widths("big_last")
big_last = torch.nn.Sequential(*[torch.nn.Linear(a, b) for a, b in zip(widths, widths[1:])])
params = list(big_last.parameters())
backward_order = params[::-1]
ddp_index, _ = torch.distributed._compute_bucket_assignment_by_size(
    backward_order, [torch.distributed._DEFAULT_FIRST_BUCKET_BYTES, ddp._DEFAULT_BUCKET_CAP_MB * 2**20])
rules = {"DDP": [[backward_order[i] for i in b] for b in ddp_index],
         "hvdsync": buckets(params, SyncConfig().grouped_mb * 2**20)}
for rule, cut in rules.items():
    print(f"{rule:8} buckets (MiB, backward order): "
          + ", ".join(f"{sum(p.numel() * 4 for p in b) / 2**20:.3f} ({len(b)} tensors)" for b in cut))
assert [p.shape for p in rules["DDP"][0]] == [params[-1].shape, params[-2].shape], "DDP: bias and weight together"
assert len(rules["hvdsync"][0]) == 1 and rules["hvdsync"][0][0] is params[-1], "hvdsync: the bias alone"
print(f"in this run the step took {np.median(default['step_seconds']) * 1e3:.0f} ms grouped and "
      f"{np.median(hooks['step_seconds']) * 1e3:.0f} ms with the hooks (medians of {len(hooks['step_seconds'])})")

# %% [markdown]
# Whether the hooks' overlap pays for their extra rounds depends on the model and the machine: the 25 MiB default
# was chosen on small models, whose backward is over before a hook's all-reduce could hide behind it
# (`docs/measurements/training.md`, "The small CNN against DDP"). For a model like this one, set
# `sync.grouped_mb` below its gradient size and compare the step times, as above.

# %% [markdown]
# ## 4 · Overlap with the next batch
#
# Communication is not the only thing a step can hide: the *next* batch can be loaded while this one computes
# and all-reduces. In the same job, the same model (hvdsync's default optimizer, batches of 32) trained six steps
# at a time with the loading in line, then with a thread loading batch i + 1 as soon as step i has its batch (the
# `pool.submit` line in `probe_and_more`), alternating twice, timing how long each step waited for its batch and
# the whole step. Loading is a 30 ms sleep standing in for reading
# and decoding (I/O, which leaves the cores to the step); a torch `DataLoader` with `num_workers` does the same
# with processes (notebook 02 measures it).

# %%
pre = {k: {m: 1e3 * np.array(v) for m, v in extras["prefetch"][k].items()} for k in (False, True)}
in_line, ahead = pre[False], pre[True]
print(f"waiting for the batch, per step (median of {len(in_line['wait'])}): {np.median(in_line['wait']):.1f} ms in "
      f"line, {np.median(ahead['wait']):.1f} ms prefetched (loading takes {LOAD_S * 1e3:.0f} ms)")
print(f"in this run the whole step took {np.median(in_line['step']):.1f} ms in line and {np.median(ahead['step']):.1f} "
      "ms prefetched (medians; step times on shared cores scatter far more than the loading)")
# Checked on the wait, which the step's own noise does not reach: prefetched, the batch is (nearly) ready.
assert np.median(ahead["wait"]) < 0.5 * LOAD_S * 1e3 <= np.median(in_line["wait"]), "prefetching hides the loading"

fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3))
for ax, metric in ((a1, "wait"), (a2, "step")):
    ax.boxplot([in_line[metric], ahead[metric]], vert=False)
    ax.set_yticks([1, 2], ["loading in line", "next batch prefetched"])
    ax.set_xlabel(f"{metric} per step (ms), 2 workers")
a1.axvline(LOAD_S * 1e3, color="grey", ls=":", label="one load"), a1.legend(fontsize=8)
a1.set_title("Waiting for the batch"), a2.set_title("The whole step")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 5 · Hiding nearly all of it: compute per bucket longer than its transfer
#
# Sections 1-3 hid part of the all-reduce at best, because on these models a layer's backward is shorter than its
# gradient's all-reduce: the transfers queue up behind each other and run on after backward. The guide's "almost
# entirely" needs the opposite: **every bucket's backward takes longer than its transfer**, so each all-reduce is over
# before the next gradient is ready, and only the last one (the input end's, ready when backward ends) is left
# exposed, so the input end must have a small gradient and compute of its own. The fusion-64 MiB job also ran the
# probe on such a model (`hvdlab.torch.hiding.model`: an 8 -> 1024 projection on each of 32 positions, averaged, then
# four 1024 x 1024 layers; batch 256), with the hooks and after backward. From the same
# timeline: the hidden share, the all-reduce time left outside backward per step, and, per 4 MiB weight, its
# backward compute (the gap between its ready stamp and the next weight's) against how long its all-reduce ran (with
# the hooks, each weight is ready on its own, so each is its own all-reduce; after backward all of them are fused
# into one).

# %%
hide_rows = {row["variant"]: row for row in extras["hide"]}
hide_result = {}
for variant, row in hide_rows.items():
    spans = tl64.select(op="ALLREDUCE", name=row["bytes"].__contains__, between=row["segment"])
    assert {s.name for s in spans} == set(row["bytes"]), "every gradient appears in the timeline"
    steps_n = len(row["backward"])
    busy = timeline.busy_seconds(spans) / steps_n
    share = timeline.overlap(spans, row["backward"])
    backward = np.mean([b - a for a, b in row["backward"]])
    hide_result[variant] = {"share": share, "busy": busy, "exposed": (1 - share) * busy, "backward": backward,
                            "step": np.median(row["step_seconds"]), "spans": spans}
    print(f"{variant:14}: all-reduce busy {busy * 1e3:6.1f} ms/step, hidden {share:6.1%}, left outside backward "
          f"{(1 - share) * busy * 1e3:5.1f} ms/step; backward {backward * 1e3:6.1f} ms; step (median) "
          f"{np.median(row['step_seconds']) * 1e3:6.1f} ms")
# The condition, checked per 4 MiB weight on the hooks' row: its backward compute (from its ready stamp to the next
# weight's, in backward order) against how long its all-reduce ran.
hooks_row, alone = hide_rows["hooks"], hide_rows["after_backward"]
weights = [n for n in hooks_row["bytes"] if n.endswith("weight") and hooks_row["bytes"][n] == 4 * 2**20][::-1]
order = [n for n in hooks_row["bytes"] if n.endswith("weight")][::-1]      # backward order: output end first
compute_ms, transfer_ms = [], []
for name in weights:
    following = order[order.index(name) + 1]
    compute_ms.append(1e3 * np.median([b - a for a, b in zip(hooks_row["ready"][name], hooks_row["ready"][following])]))
    transfer_ms.append(1e3 * np.median([s.end - s.start for s in hide_result["hooks"]["spans"] if s.name == name]))
for name, c, t in zip(weights, compute_ms, transfer_ms):
    print(f"{name:9} (4 MiB): backward until the next gradient {c:6.1f} ms, its all-reduce {t:5.1f} ms")
print(f"in this run: with the hooks {hide_result['hooks']['share']:.0%} of the all-reduce time fell inside backward "
      f"(after backward: {hide_result['after_backward']['share']:.0%}); the step took "
      f"{hide_result['hooks']['step'] * 1e3:.0f} ms with the hooks, {hide_result['after_backward']['step'] * 1e3:.0f} ms "
      "after backward")
assert np.median(compute_ms) > np.median(transfer_ms), "the model is built so that compute per bucket exceeds transfer"
assert hide_result["hooks"]["share"] > 0.8, "compute per bucket above its transfer: nearly all of it hides"
assert hide_result["after_backward"]["share"] < 0.05, "after backward nothing hides, on this model too"

fig, ax = plt.subplots(figsize=(8, 2.8))
for y, variant in enumerate(("after_backward", "hooks")):
    r = hide_result[variant]
    ax.barh(y, (r["busy"] - r["exposed"]) * 1e3, color="tab:green", label="hidden inside backward" if y else None)
    ax.barh(y, r["exposed"] * 1e3, left=(r["busy"] - r["exposed"]) * 1e3, color="tab:red",
            label="left outside backward" if y else None)
ax.set_yticks([0, 1], ["after backward", "hooks"])
ax.set_xlabel("all-reduce time per step (ms), from Horovod's timeline")
ax.set_title("compute per bucket > transfer: the hooks hide nearly all of it")
ax.legend(fontsize=8)
plt.tight_layout()
plt.show()

# %% [markdown]
# Hidden on the timeline is not the same as a shorter step *here*: on CPUs, Gloo's transfer and its adds need the
# same cores as backward, so a hidden all-reduce takes its time out of backward instead (compare the two step times
# printed above). Where the transfer and the adds run beside the compute (GPUs with NCCL: copy engines, the NIC,
# RDMA) hiding is what shortens the step.
#
# **When this holds on real hardware.** A dense layer's backward costs about 4·B floating-point operations per
# parameter for a batch of B (two products), and a ring all-reduce moves about 2·(W−1)/W · 4 bytes per float32
# parameter. So a bucket's backward outlasts its transfer when B / F > 2·(W−1)/W / BW, with F the accelerator's
# sustained FLOP/s and BW the link's bytes/s: a large batch per accelerator and layers that reuse each weight many
# times per sample (convolutions) on a fast fabric satisfy it; layers with many parameters and little compute
# (embeddings, fully connected heads), small batches per accelerator or slow Ethernet do not. Below, the cost
# model's transfer time of one 25 MiB bucket (DDP's and hvdsync's bucket size) on 8 ranks for the fabrics of
# notebook 03 (vendors' figures, predictions, not measurements): the backward of each 25 MiB of gradient must take
# at least that long for the transfer to hide. The last bucket stays exposed whatever the fabric.

# %%
from hvdlab import costmodel

bucket = 25 * 2**20
for fabric in costmodel.FABRICS:
    t = costmodel.predict("ring", bucket, 8, fabric.link())
    print(f"{fabric.name:38}: a 25 MiB bucket's ring all-reduce on 8 ranks ~{t * 1e3:5.2f} ms (predicted)")
assert costmodel.predict("ring", bucket, 8, costmodel.FABRICS[0].link()) < \
    costmodel.predict("ring", bucket, 8, costmodel.FABRICS[-1].link())

# %% [markdown]
# ## What to take away
#
# * Horovod's hooks start each gradient's all-reduce as soon as backward produces it, so part of the communication
#   runs while backward is still computing (asserted: over 5 % in the best row; in this run the share printed in
#   section 1); an all-reduce started after backward hides nothing (asserted: under 5 % in every row).
# * **hvdsync's PyTorch default for small models is buckets like DDP's** (DDP closes a bucket after the tensor
#   that reaches its cap, hvdsync before a tensor that would pass it): gradients up to `sync.grouped_mb` (25 MiB) go
#   in two or three grouped all-reduces, each started when backward has produced its bucket's last gradient, so
#   little overlaps and a step pays Horovod's fixed cost per bucket, not per group of hooks; bigger models, or
#   `sync.grouped_mb: 0`, get the hooks (section 3: on the probe's model less hides than with the hooks).
# * The timeline is the instrument: per tensor it shows when the request arrived, when the collective ran and what
#   it did; the hidden share is a few lines of interval arithmetic on it (section 1, equal to
#   `hvdsync.core.telemetry.timeline.overlap`).
# * Layer order decides when each gradient can start: backward makes the output end's gradients first (asserted
#   on the ready stamps of every step; section 2 draws them). How much more that hides is not fixed: section 1
#   prints the hidden share of both orders "in this run", and on shared cores their order can flip.
# * The fusion threshold trades per-message latency (many small all-reduces) against waiting to fill a buffer;
#   which wins depends on the sizes, the cycle time and the link, and on a small machine the workers and Horovod's
#   threads compete for the same cores, which limits how much can overlap at all.
# * Loading the next batch while the step runs hides the loading: the step waits for its batch less than half a
#   load (section 4, asserted; the step times of this run are printed there).
# * Communication hides almost entirely when every bucket's backward takes longer than its transfer and the last
#   bucket, ready when backward ends, is small: section 5 builds such a model and the hooks hid over 80 % of the
#   all-reduce time (asserted; this run's share printed there). On real clusters that takes enough compute per
#   byte of gradient (large batches per accelerator, convolutions) on a fast enough fabric.
