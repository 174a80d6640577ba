"""The cost model against measurement: this machine's figures, Horovod's patterns timed, alpha-beta fitted, ratios.

    python benchmarks/costmodel.py                    # 1-64 MiB, 10 repeats per size and pattern (~2 min)
    python benchmarks/costmodel.py --quick            # 1 and 4 MiB, 3 repeats: every path in ~30 s
    python benchmarks/costmodel.py --json costmodel.json

1. This machine, measured (:mod:`hvdsync.core.hardware`): cores, memory, one core's copy and add throughput (the add
   throughput is the model's gamma), loopback TCP latency and bandwidth.
2. Horovod on 2 local workers (:func:`hvdsync.torch.measure.collective_times`): ring all-reduce, sharded parameter
   server (reduce-scatter + all-gather), single server (alltoall to rank 0 + broadcast), gossip neighbour
   exchange; every result checked; the median of the repeats (each repeat is the slowest rank's time).
3. alpha and beta fitted to the ring medians (:func:`hvdsync.core.costmodel.fit_link`, gamma from step 1), then the
   model's prediction over the measurement, per size and pattern: the target is a ratio within 1/1.5 .. 1.5 for the
   ring at 1-64 MiB.
4. The model with vendors' fabric figures (:data:`hvdsync.core.costmodel.FABRICS`): predicted all-reduce time of a
   stated model size on 8 and 64 ranks.

The machine is shared and noisy: the medians move by tens of percent between runs; the ratios are what to read.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hvdsync import launch  # noqa: E402
from hvdsync.config import SyncConfig  # noqa: E402
from hvdsync.core import costmodel, hardware  # noqa: E402
from hvdsync.torch.measure import PATTERNS, collective_times  # noqa: E402

MiB = 2**20
# ResNet-50's 25.6 M float32 parameters: the usual yardstick for data-parallel all-reduce.
MODEL_BYTES = 25_557_032 * 4


def run(sizes_mib: list[float], repeats: int) -> dict:
    facts = {**hardware.describe(), "memory": hardware.memory_bandwidth(), "loopback": hardware.loopback()}
    sizes = [int(s * MiB) for s in sizes_mib]
    per_rank = launch.run(collective_times, args=(sizes, repeats), np=2, sync=SyncConfig(), progress=False)
    result = per_rank[0]
    if not all(all(r["correct"].values()) for r in per_rank):
        raise SystemExit(f"a collective returned a wrong result: {[r['correct'] for r in per_rank]}")
    medians = {p: {s: statistics.median(result["times"][p][s]) for s in sizes} for p in PATTERNS}
    gamma = facts["memory"]["gamma"]
    link = costmodel.fit_link(sizes, [medians["ring"][s] for s in sizes], 2, gamma=gamma, name="this machine, fitted")
    ratios = {p: {s: costmodel.predict(p, s, 2, link) / medians[p][s] for s in sizes} for p in PATTERNS}
    fabrics = {n: costmodel.fabric_table(MODEL_BYTES, n) for n in (8, 64)}
    return {"machine": facts, "sizes": sizes, "repeats": repeats, "medians": medians, "ratios": ratios,
            "fit": {"alpha": link.alpha, "beta": link.beta, "gamma": link.gamma},
            "fabrics": fabrics, "model_bytes": MODEL_BYTES}


def show(doc: dict) -> None:
    m = doc["machine"]
    print(f"this machine: {m['logical_cpus']} logical CPUs ({m['usable_cpus']} usable), {m['cpu_model']}, "
          f"{m['memory_bytes'] / 2**30:.1f} GiB")
    print(f"  one core: copy {m['memory']['copy_bytes_per_s'] / 1e9:.1f} GB/s, add (a += b) "
          f"{m['memory']['add_bytes_per_s'] / 1e9:.1f} GB/s -> gamma = {m['memory']['gamma'] * 1e12:.0f} ps/byte")
    print(f"  loopback TCP: latency {m['loopback']['latency_s'] * 1e6:.1f} us one way, bandwidth "
          f"{m['loopback']['bandwidth_bytes_per_s'] / 1e9:.2f} GB/s")
    fit = doc["fit"]
    print(f"fit to the ring medians: alpha = {fit['alpha'] * 1e6:.1f} us, beta = 1 / "
          f"({1 / fit['beta'] / 1e9:.2f} GB/s)" if fit["beta"] else f"alpha = {fit['alpha']}")
    print(f"\nmedian of {doc['repeats']} (ms) and predicted / measured, 2 workers:")
    print(f"{'size':>8} | " + " | ".join(f"{p:>20}" for p in PATTERNS))
    for s in doc["sizes"]:
        cells = [f"{doc['medians'][p][s] * 1e3:9.2f} ms  x{doc['ratios'][p][s]:5.2f}" for p in PATTERNS]
        print(f"{s / MiB:>5g} MiB | " + " | ".join(f"{c:>20}" for c in cells))
    ring = list(doc["ratios"]["ring"].values())
    print(f"ring ratios {min(ring):.2f}-{max(ring):.2f} (target: within 0.67-1.5)")
    print(f"\npredicted all-reduce of {doc['model_bytes'] / 1e6:.0f} MB (ResNet-50, fp32) by fabric (ms):")
    for n, rows in doc["fabrics"].items():
        print(f"  {n} ranks: " + "; ".join(f"{r['fabric']}: ring {r['ring'] * 1e3:.1f}, one server {r['ps'] * 1e3:.1f}"
                                         for r in rows))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1,2,4,8,16,32,64", help="MiB, comma-separated")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="1 and 4 MiB, 3 repeats")
    parser.add_argument("--json", help="also write every figure here")
    args = parser.parse_args(argv)
    sizes = [1.0, 4.0] if args.quick else [float(s) for s in args.sizes.split(",")]
    doc = run(sizes, 3 if args.quick else args.repeats)
    show(doc)
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1, default=str))


if __name__ == "__main__":
    main()
