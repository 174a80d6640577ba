"""Where the fp16 training step's time goes against the fp32 one: phases, page faults, CPU, the all-reduce's share.

    python benchmarks/step.py fp16                       # the 21 M-parameter MLP of training.py, 2 workers, 20 steps
    python benchmarks/step.py fp16 --steps 40 --md out.md
    python benchmarks/step.py fp16 --quick               # a 64-128-128-10 MLP, 2 steps: every path in seconds

``training.py --only api,fp16`` found the fp16 step no shorter than the fp32 one although an fp16 all-reduce alone
takes half the time (``step.py fp16-path``). This runs the contenders below in the *same* two workers, one step of each
in turn (a barrier before each), so that machine noise lands on all alike, and splits every step into forward +
backward, the wait for the all-reduces (``synchronize``) and the update, with the process's page faults and CPU time:

* ``fp32``: ``hvdsync.torch.distributed_optimizer`` with ``compression="none"`` (hvdsync's defaults);
* ``fp16``: the same with ``compression="fp16"`` (the hook casts in place: :class:`~hvdsync.torch.compression.
  CodecCompressor` ``in_place=True``);
* ``fp16, allocating hook``: Horovod's optimizer with the hook as it was before (a new float16 tensor and a new
  float32 one per gradient per step: ``CodecCompressor("fp16")``);
* each again with ``sleeping wait``: the handles polled with ``hvd.poll`` and a 50 us sleep before ``synchronize``,
  instead of Horovod 0.28.1's wait, which spins (``WaitAndClear``: poll and ``sched_yield`` with the GIL released)
  and so takes a core from the threads doing the all-reduce on a 2-core machine. It stands for Horovod patch 0005
  (a condition variable); with that patch installed both rows of a pair wait alike;
* ``compute only``: the same forward, backward and update on each worker's half of the batch, no Horovod;
* ``all-reduce alone``: after each fp32/fp16 step, the same gradients all-reduced once more in one grouped call,
  nothing overlapping it: the all-reduce's own time (``step.py fp16-path`` splits it further).

A step's time is the slowest rank's; the table gives medians over the timed steps. Every contender's parameters
must end equal on both ranks (the run fails otherwise) and the fp16 ones close to the fp32 ones.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time
from pathlib import Path

CONTENDERS = ("fp32", "fp16", "fp16 allocating", "fp32 sleep", "fp16 sleep", "fp16 allocating sleep", "compute only")
LABELS = {"fp16 allocating": "fp16, allocating hook (before)", "fp32 sleep": "fp32, sleeping wait",
          "fp16 sleep": "fp16, sleeping wait", "fp16 allocating sleep": "fp16, allocating hook, sleeping wait"}


def _optimizer(name: str, model, lr: float):
    import horovod.torch as hvd
    import torch
    from torch import nn

    import hvdsync.torch as hs
    from hvdsync.config import SyncConfig
    from hvdsync.torch.compression import CodecCompressor

    opt = torch.optim.SGD(model.parameters(), lr=lr)
    if name == "compute only":
        return opt
    holder = nn.Module()  # a prefix per contender: Horovod's tensor names (and its response cache) stay apart
    holder.add_module(name.replace(" ", "_"), model)
    if name.startswith("fp16 allocating"):
        return hvd.DistributedOptimizer(opt, named_parameters=list(holder.named_parameters()),
                                        compression=CodecCompressor("fp16"))
    # Horovod's per-tensor hooks, as the 21 M-parameter MLP gets by default (its 84 MB are over sync.grouped_mb);
    # the --quick model would otherwise go to the grouped call after backward.
    return hs.distributed_optimizer(opt, holder, SyncConfig(grouped_mb=0),
                                    compression="fp16" if name.startswith("fp16") else "none")


def _sleeping_wait(opt) -> None:
    import horovod.torch as hvd

    for handle, _ in list(opt._handles.values()):  # Horovod's own bookkeeping: (handle, ctx) per gradient
        if handle is not None:
            while not hvd.poll(handle):
                time.sleep(50e-6)


def _worker(steps: int, warmup: int, quick: bool = False) -> dict:
    import horovod.torch as hvd
    import torch
    import torch.nn.functional as F

    import hvdsync.torch as hs
    from hvdlab.bench.step_common import Work, data, fingerprint
    from hvdlab.bench.step_torch import model

    hs.init()
    work = Work("mlp", warmup=warmup, steps=steps, **({"features": 64, "hidden": 128} if quick else {}))
    x, y = data(work)
    half = work.global_batch // hvd.size()
    lo = hvd.rank() * half
    xb, yb = torch.from_numpy(x[lo:lo + half]), torch.from_numpy(y[lo:lo + half])  # the same batch every step
    runs = {}
    for name in CONTENDERS:
        m = model(work)
        runs[name] = (m, _optimizer(name, m, work.lr))
    keys = ("step", "compute", "wait", "update", "faults", "cpu", "alone")
    out = {name: {k: [] for k in keys} for name in CONTENDERS}
    for i in range(warmup + steps):
        for name, (m, opt) in runs.items():
            hvd.allreduce(torch.zeros(1), name="barrier")
            r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            opt.zero_grad()
            F.cross_entropy(m(xb), yb).backward()
            t1 = time.perf_counter()
            if name != "compute only":
                if name.endswith("sleep"):
                    _sleeping_wait(opt)
                opt.synchronize()
            t2 = time.perf_counter()
            if name != "compute only":
                with opt.skip_synchronize():
                    opt.step()
            else:
                opt.step()
            t3, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
            alone = 0.0
            if name in ("fp32", "fp16"):
                wire = [p.grad.to(torch.float16 if name == "fp16" else torch.float32) for p in m.parameters()]
                hvd.allreduce(torch.zeros(1), name="barrier")
                t4 = time.perf_counter()
                hvd.grouped_allreduce(wire, name=f"alone.{name}")
                alone = time.perf_counter() - t4
            if i >= warmup:
                row = out[name]
                for k, v in (("step", t3 - t0), ("compute", t1 - t0), ("wait", t2 - t1), ("update", t3 - t2),
                             ("alone", alone)):
                    row[k].append(1e3 * v)
                row["faults"].append(r1.ru_minflt - r0.ru_minflt)
                row["cpu"].append(1e3 * (r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime))
    result = {}
    for name, (m, _) in runs.items():
        # The slowest rank's step: a synchronous step is over when both ranks are.
        slowest = hvd.allgather(torch.tensor([out[name]["step"]]), name=f"s.{name}").max(0).values.tolist()
        med = {k: statistics.median(v) for k, v in out[name].items()}
        med["step"] = statistics.median(slowest)
        params = [p.detach().numpy().copy() for p in m.parameters()]
        result[name] = {**med, "fingerprint": fingerprint(params)}
    return result


def table(ranks: list[dict]) -> list[str]:
    import numpy as np

    r0 = ranks[0]
    rows = ["| contender | step ms | / fp32, same wait | forward + backward ms | wait ms | update ms | "
            "page faults / step | CPU ms / step | all-reduce alone ms |", "|---|---|---|---|---|---|---|---|---|"]
    for name in CONTENDERS:
        base = r0["fp32 sleep" if name.endswith("sleep") else "fp32"]["step"]
        row = r0[name]
        ratio = "-" if name == "compute only" else f"{row['step'] / base:.2f}"
        alone = f"{row['alone']:.1f}" if row["alone"] else "-"
        rows.append(f"| {LABELS.get(name, name)} | {row['step']:.1f} | {ratio} | {row['compute']:.1f} | "
                    f"{row['wait']:.1f} | {row['update']:.1f} | {row['faults']:.0f} | {row['cpu']:.0f} | {alone} |")
    ref = r0["compute only"]["fingerprint"]
    for name in CONTENDERS[:-1]:  # compute only: each rank stepped on its own half
        a, b = ranks[0][name]["fingerprint"], ranks[1][name]["fingerprint"]
        if not (np.array_equal(a["sample"], b["sample"]) and np.array_equal(a["sums"], b["sums"])):
            raise SystemExit(f"{name}: parameters differ between the ranks")
    moved = np.abs(r0["fp32"]["fingerprint"]["sample"] - ref["sample"]).max()  # the average vs a rank's half
    for name in CONTENDERS[1:-1]:
        off = np.abs(r0[name]["fingerprint"]["sample"] - r0["fp32"]["fingerprint"]["sample"]).max()
        if off > 0.05 * moved:
            raise SystemExit(f"{name}: parameters {off:.2e} from fp32's (fp32 vs one rank's half: {moved:.2e})")
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="step.py fp16", description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=20, help="timed steps of each contender")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--md", metavar="PATH", help="also write the table as markdown")
    p.add_argument("--json", metavar="PATH", help="also write each rank's medians per contender as JSON")
    p.add_argument("--quick", action="store_true", help="a tiny MLP, 2 steps after 1: exercises every path")
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.warmup = 2, 1
    from hvdsync import launch

    load = os.getloadavg()
    ranks = launch.run(_worker, args=(args.steps, args.warmup, args.quick), np=2, progress=False)
    fp32, fp16 = ranks[0]["fp32"], ranks[0]["fp16"]
    model = "64-128-128-10 (--quick)" if args.quick else "1024-4096-4096-10 (21.0 M parameters)"
    lines = [f"`python benchmarks/step.py fp16 --steps {args.steps}`: torch MLP {model}, "
             f"2 workers x 32 samples, {args.steps} timed steps per contender, interleaved; "
             f"{os.cpu_count()} CPUs, load average at start {load[0]:.1f}, at end {os.getloadavg()[0]:.1f}", "",
             *table(ranks), "",
             f"- all-reduce alone, fp16 / fp32: {fp16['alone'] / fp32['alone']:.2f}; its share of the fp32 step: "
             f"{fp32['alone'] / fp32['step']:.2f} (sleeping wait: the fp32 step's wait is "
             f"{ranks[0]['fp32 sleep']['wait'] / ranks[0]['fp32 sleep']['step']:.2f} of it)",
             f"- fp16 step / fp32 step: {fp16['step'] / fp32['step']:.2f} (target <= 0.75); with the sleeping wait "
             f"{ranks[0]['fp16 sleep']['step'] / ranks[0]['fp32 sleep']['step']:.2f}; the allocating hook "
             f"{ranks[0]['fp16 allocating']['step'] / fp32['step']:.2f}",
             "- parameters equal on both ranks for every contender; fp16 within 5 % of one step's spread of fp32"]
    text = "\n".join(lines)
    print(text)
    if args.md:
        Path(args.md).write_text(text + "\n")
    if args.json:  # the fingerprints are what the table checked; the figures are the rest
        rows = [{n: {k: v for k, v in row.items() if k != "fingerprint"} for n, row in r.items()} for r in ranks]
        Path(args.json).write_text(json.dumps({"steps": args.steps, "quick": args.quick,
                                               "load": [load[0], os.getloadavg()[0]], "ranks": rows}, indent=1))
    return 0
