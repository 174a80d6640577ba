"""The cost model against measurement: this machine's figures, Horovod's patterns timed, alpha-beta fitted, ratios.

    python benchmarks/costmodel.py                    # 1-64 MiB on 2 workers, 10 rounds (~3 min on a quiet machine)
    python benchmarks/costmodel.py --np 4             # 4 workers: the single server's bottleneck shows
    python benchmarks/costmodel.py --quick            # 1 and 4 MiB, 3 rounds: every path in ~40 s
    python benchmarks/costmodel.py --json costmodel.json
    python benchmarks/costmodel.py --record quiet     # keep it: benchmarks/results/costmodel/<date>-quiet.{txt,json}

1. This machine, measured (:mod:`hvdlab.hardware`): cores, memory, one core's copy and add throughput (the add
   throughput is the model's gamma), loopback TCP latency and bandwidth.
2. Horovod on ``--np`` local workers (:func:`hvdlab.torch.measure.collective_times`): ring all-reduce, sharded
   parameter server (alltoall push + local sum, allgather pull), single server (alltoall to rank 0 + broadcast),
   gossip neighbour exchange, and the pieces: one Horovod call (a 4-byte all-reduce), allocating and filling a
   buffer (fresh memory: each call's new output tensors pay it), the push, the pull, and Horovod's own
   reducescatter. One warm-up round, then rounds that visit every size and pattern in turn; every
   result checked; the median per size and pattern (each timing is the slowest rank's).
3. The link fitted to the ring medians (:func:`hvdlab.costmodel.fit_link`): the per-call cost and the fresh
   memory cost measured apart (step 2) and gamma from step 1 are subtracted, alpha and beta fitted. Then predicted /
   measured per size and pattern with :func:`~hvdlab.costmodel.horovod_time` (the calls and the algorithms Horovod
   runs on Gloo); the textbook schedules (:func:`~hvdlab.costmodel.predict`, fitted without the call term)
   for comparison. The target: every ratio within 1/1.5 .. 1.5.
4. Bytes through rank 0 per pattern (as Gloo runs it), and the model with vendors' fabric figures
   (:data:`hvdlab.costmodel.FABRICS`): predicted all-reduce time of a stated model size on 8 and 64 ranks.

The machine is shared: medians move by tens of percent between runs when other jobs run; the ratios, measured side
by side in one run, are what to read. With more workers than cores (``--np 4`` on 2 cores) the processes take
turns on the CPUs: big messages are still bound by the copies through loopback, small ones by scheduling.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from dataclasses import replace
from pathlib import Path

from hvdlab import costmodel, hardware
from hvdlab.bench import suite
from hvdlab.torch.measure import PATTERNS, PIECES, collective_times
from hvdsync import launch
from hvdsync.config import SyncConfig

MiB = 2**20
# ResNet-50's 25.6 M float32 parameters: the usual yardstick for data-parallel all-reduce.
MODEL_BYTES = 25_557_032 * 4
MODELLED = PATTERNS + ("push", "pull", "reducescatter")


def run(sizes_mib: list[float], repeats: int, np: int = 2) -> dict:
    facts = {**hardware.describe(), "memory": hardware.memory_bandwidth(), "loopback": hardware.loopback(),
             "load_before": os.getloadavg()}
    sizes = [int(s * MiB) for s in sizes_mib]
    per_rank = launch.run(collective_times, args=(sizes, repeats, PATTERNS + PIECES), np=np, sync=SyncConfig(),
                          progress=False)
    facts["load_after"] = os.getloadavg()
    wrong = {p: sum(r["wrong"][p] for r in per_rank) for p in PATTERNS + PIECES}
    if any(wrong[p] for p in PATTERNS + ("push", "pull", "call")):
        raise SystemExit(f"a collective of hvdsync's returned a wrong result (count per pattern): {wrong}")
    times = per_rank[0]["times"]
    medians = {p: {s: statistics.median(times[p][s]) for s in sizes} for p in PATTERNS + PIECES}
    call = statistics.median(t for s in sizes for t in times["call"][s])
    # Fresh memory per size: glibc serves big allocations (>= 32 MiB) by mmap, whose pages fault in on first
    # write, and smaller ones from the heap it keeps: the cost per byte jumps with the size.
    mu = {s: medians["fresh"][s] / s for s in sizes}
    gamma = facts["memory"]["gamma"]
    ring = [medians["ring"][s] for s in sizes]
    link = costmodel.fit_link(sizes, ring, np, gamma=gamma, name="this machine, fitted", call=call,
                              mu=[mu[s] for s in sizes])
    at = {s: replace(link, mu=mu[s]) for s in sizes}
    textbook = costmodel.fit_link(sizes, ring, np, gamma=gamma, name="this machine, fitted (textbook)")
    ratios = {p: {s: costmodel.horovod_time(p, s, np, at[s]) / medians[p][s] for s in sizes} for p in MODELLED}
    textbook_ratios = {p: {s: costmodel.predict(p, s, np, textbook) / medians[p][s] for s in sizes}
                       for p in PATTERNS}
    rank0 = {p: costmodel.horovod_rank0_bytes(p, max(sizes), np) for p in PATTERNS}
    fabrics = {n: costmodel.fabric_table(MODEL_BYTES, n) for n in (8, 64)}
    return {"machine": facts, "np": np, "sizes": sizes, "repeats": repeats, "medians": medians, "ratios": ratios,
            "textbook_ratios": textbook_ratios, "wrong": wrong, "rank0_bytes": rank0,
            "fit": {"call": call, "mu": {str(s): m for s, m in mu.items()}, "alpha": link.alpha, "beta": link.beta,
                    "gamma": link.gamma},
            "fit_textbook": {"alpha": textbook.alpha, "beta": textbook.beta},
            "fabrics": fabrics, "model_bytes": MODEL_BYTES}


def _table(doc: dict, patterns: tuple[str, ...], ratios: dict) -> None:
    print(f"{'size':>8} | " + " | ".join(f"{p:>20}" for p in patterns))
    for s in doc["sizes"]:
        cells = [f"{doc['medians'][p][s] * 1e3:9.2f} ms" + (f"  x{ratios[p][s]:5.2f}" if p in ratios else "")
                 for p in patterns]
        print(f"{s / MiB:>5g} MiB | " + " | ".join(f"{c:>20}" for c in cells))


def _span(ratios: dict, pattern: str) -> str:
    values = list(ratios[pattern].values())
    ok = sum(1 / 1.5 <= v <= 1.5 for v in values)
    return f"{pattern} {min(values):.2f}-{max(values):.2f} ({ok}/{len(values)} within)"


def show(doc: dict) -> None:
    m, n = doc["machine"], doc["np"]
    print(f"this machine: {m['logical_cpus']} logical CPUs ({m['usable_cpus']} usable), {m['cpu_model']}, "
          f"{m['memory_bytes'] / 2**30:.1f} GiB; load average {m['load_before'][0]:.1f} before, "
          f"{m['load_after'][0]:.1f} after")
    print(f"  one core: copy {m['memory']['copy_bytes_per_s'] / 1e9:.1f} GB/s, add (a += b) "
          f"{m['memory']['add_bytes_per_s'] / 1e9:.1f} GB/s -> gamma = {m['memory']['gamma'] * 1e12:.0f} ps/byte")
    print(f"  loopback TCP: latency {m['loopback']['latency_s'] * 1e6:.1f} us one way, bandwidth "
          f"{m['loopback']['bandwidth_bytes_per_s'] / 1e9:.2f} GB/s")
    if n > m["usable_cpus"]:
        print(f"  {n} workers on {m['usable_cpus']} usable cores: oversubscribed (the processes take turns)")
    fit, tb = doc["fit"], doc["fit_textbook"]
    mus = list(fit["mu"].values())
    print(f"measured apart: one Horovod call (4-byte all-reduce) {fit['call'] * 1e3:.2f} ms, fresh memory "
          f"(allocate + fill) 1 / ({1 / max(mus) / 1e9:.2f} .. {1 / min(mus) / 1e9:.2f} GB/s) by size;\n"
          "fit to the ring medians after them: "
          f"alpha = {fit['alpha'] * 1e6:.1f} us, beta = 1 / ({1 / fit['beta'] / 1e9:.2f} GB/s)"
          if fit["beta"] else f"fit: {fit}")
    print(f"\nmedian (ms) and predicted / measured (horovod_time), {n} workers, {doc['repeats']} rounds:")
    _table(doc, PATTERNS, doc["ratios"])
    print("\nthe pieces (sharded PS = push + pull; reducescatter: Horovod's, which the push replaced):")
    _table(doc, PIECES, doc["ratios"])
    print("\nratios, horovod_time: " + "; ".join(_span(doc["ratios"], p) for p in MODELLED))
    print(f"ratios, textbook schedules (alpha {tb['alpha'] * 1e6:.0f} us, beta 1 / ({1 / tb['beta'] / 1e9:.2f} GB/s)"
          "): " + "; ".join(_span(doc["textbook_ratios"], p) for p in PATTERNS) if tb["beta"] else "")
    print("target: within 0.67-1.5")
    wrong = {p: c for p, c in doc["wrong"].items() if c}
    print(f"wrong results (all ranks, every timing): {wrong or 'none'}")
    big = max(doc["sizes"])
    print(f"\nrank 0 per round of {big / MiB:g} MiB on {n} ranks, as Gloo runs it (sent / received, MiB) and time:")
    for p in PATTERNS:
        sent, received = doc["rank0_bytes"][p]
        print(f"  {p:>10}: {sent / MiB:7.1f} / {received / MiB:7.1f}   {doc['medians'][p][big] * 1e3:8.1f} ms "
              f"measured, {doc['ratios'][p][big] * doc['medians'][p][big] * 1e3:8.1f} ms predicted")
    print(f"\npredicted all-reduce of {doc['model_bytes'] / 1e6:.0f} MB (ResNet-50, fp32) by fabric (ms):")
    for k, rows in doc["fabrics"].items():
        print(f"  {k} ranks: " + "; ".join(f"{r['fabric']}: ring {r['ring'] * 1e3:.1f}, one server {r['ps'] * 1e3:.1f}"
                                         for r in rows))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=suite.RECORD_HELP)
    parser.add_argument("--sizes", default="1,2,4,8,16,32,64", help="MiB, comma-separated")
    parser.add_argument("--repeats", type=int, default=10, help="timed rounds after the warm-up")
    parser.add_argument("--np", type=int, default=2, help="local workers")
    parser.add_argument("--quick", action="store_true", help="1 and 4 MiB, 3 rounds")
    parser.add_argument("--json", help="also write every figure here")
    args = parser.parse_args(argv)
    if args.np < 2:
        parser.error(f"--np: {args.np} is not allowed; the patterns need at least 2 workers")
    sizes = [1.0, 4.0] if args.quick else [float(s) for s in args.sizes.split(",")]
    doc = run(sizes, 3 if args.quick else args.repeats, args.np)
    show(doc)
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1, default=str))


if __name__ == "__main__":
    sys.exit(suite.run(__file__, {"costmodel": suite.Part(main, suite.first_line(__doc__))}, doc=__doc__))
