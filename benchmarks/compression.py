"""Every gradient codec side by side on 2 local workers: bytes on the wire, step time, accuracy, ratios to ``none``.

    python benchmarks/compression.py                       # torch, the communication-heavy MLP (~4.2 M parameters)
    python benchmarks/compression.py --framework tensorflow
    python benchmarks/compression.py --json compression.json
    python benchmarks/compression.py --quick               # a small MLP, 1 epoch: every codec's path in ~1 minute
    make bench                                             # allreduce.py, then this

One job of 2 Horovod workers (Gloo over loopback) trains the same model, from the same start, on the same
samples, for the same number of steps, once per codec (:func:`hvdsync.launch.train_many`). Per codec it prints:

* bytes one rank handed to Horovod per step, *counted* by hvdsync's wire counter (values and indices, scales,
  PowerSGD's factors), and the same by the codec's formula (they must agree: the run fails if not);
* step time: the mean over steps of the slowest rank's step, epochs after the first (which includes warm-up);
  ``sync`` is the share of a step spent waiting for the reduction (encoding, transfer, decoding);
* test accuracy after the last epoch, and whether both ranks ended with identical parameters;
* the ratio of bytes and of step time to ``none``.

The model is a one-hidden-layer MLP on a synthetic task (1,024 features, 4,096 hidden units, 10 classes): 4.2 M
parameters, 16.8 MB of float32 gradient per step against ~0.8 GFLOP of compute for a batch of 32, so the
all-reduce dominates a step, as for a wide model on a slow network. On 2 cores over loopback the transfer is a
memory copy, and encoding (a top-k over 4 M values, a quantisation pass) takes the same cores as the transfer: a
codec pays off here only where it saves more copying than it costs in compute.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

CODECS = ["none", "fp16", "bf16", "topk:0.01", "randk:0.01", "int8", "powersgd:2"]


def configs(framework: str, codecs: list[str], quick: bool, error_feedback: bool = True) -> list:
    from hvdsync.config import Config

    data = ({"dataset": "synthetic", "synthetic_samples": 1024, "synthetic_features": 64, "batch_size": 32}
            if quick else
            {"dataset": "synthetic", "synthetic_samples": 4096, "synthetic_features": 1024, "batch_size": 32})
    train = {"framework": framework, "np": 2, "epochs": 1 if quick else 2, "hidden": 256 if quick else 4096,
             "optimizer": "sgd", "momentum": 0.0, "lr": 0.1}
    return [Config.from_dict({"sync": {"compression": c, "error_feedback": error_feedback}, "data": data,
                              "train": train, "tracking": {"enabled": False}}) for c in codecs]


def summarise(result: dict) -> dict:
    history = result["history"]
    steady = history[1:] or history
    step = statistics.fmean(h["step_seconds_max_rank"] for h in steady)
    phases = result["phase_seconds"]
    total = sum(phases.values()) or 1.0
    return {
        "compression": result["config"]["sync"]["compression"],
        "numel": result["numel"],
        "steps": result["optimizer_steps"],
        "bytes_per_step": result["wire"]["bytes"] / max(1, result["optimizer_steps"]),
        "formula_bytes_per_step": result["wire_bytes_per_step_formula"],
        "step_ms": 1e3 * step,
        "sync_share": phases.get("sync_wait", 0.0) / total,
        "accuracy": result["test_accuracy"],
        "ranks_identical": result["param_spread"] == 0.0,
    }


def table(rows: list[dict]) -> str:
    base = next(r for r in rows if r["compression"] == "none")
    lines = [f"{'codec':<12} {'bytes/step':>12} {'x fewer':>8} {'step ms':>8} {'x time':>7} {'sync %':>7} "
             f"{'accuracy':>9} {'ranks equal':>11}"]
    for r in rows:
        r["bytes_ratio"] = base["bytes_per_step"] / r["bytes_per_step"]
        r["time_ratio"] = r["step_ms"] / base["step_ms"]
        lines.append(f"{r['compression']:<12} {r['bytes_per_step']:>12,.0f} {r['bytes_ratio']:>8.1f} "
                     f"{r['step_ms']:>8.1f} {r['time_ratio']:>7.2f} {100 * r['sync_share']:>7.1f} "
                     f"{r['accuracy']:>9.4f} {str(r['ranks_identical']):>11}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--framework", choices=("torch", "tensorflow"), default="torch")
    p.add_argument("--codecs", default=",".join(CODECS), help="comma-separated sync.compression values")
    p.add_argument("--quick", action="store_true", help="small MLP, 1 epoch: exercises every path")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON")
    args = p.parse_args(argv)
    codecs = [c.strip() for c in args.codecs.split(",") if c.strip()]
    if "none" not in codecs:
        codecs.insert(0, "none")

    from hvdsync import launch

    cfgs = configs(args.framework, codecs, args.quick)
    start = time.perf_counter()
    results = launch.train_many(cfgs)
    rows = [summarise(r) for r in results]
    wrong = [r["compression"] for r in rows if r["bytes_per_step"] != r["formula_bytes_per_step"]]
    if wrong:
        print(f"counted bytes differ from the codec formula for: {', '.join(wrong)}", file=sys.stderr)
        return 1
    first = cfgs[0]
    print(f"{args.framework}, 2 workers (Gloo, loopback): MLP {first.data.synthetic_features}-{first.train.hidden}-"
          f"{first.data.synthetic_classes}, {rows[0]['numel']:,} parameters, {rows[0]['steps']} steps of 2 x "
          f"{first.data.batch_size} samples per codec; {time.perf_counter() - start:.0f} s in all")
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"framework": args.framework, "quick": args.quick, "rows": rows},
                                              indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
