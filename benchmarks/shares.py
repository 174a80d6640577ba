"""Straggler-aware shares and a growing batch, side by side on 2 local workers: epoch time, samples, all-reduces.

    python benchmarks/shares.py                        # torch
    python benchmarks/shares.py --framework tensorflow
    python benchmarks/shares.py --rounds 3 --json shares.json

One job of 2 Horovod workers (:func:`hvdsync.launch.train_many`) trains the same model from the same start, with
rank 1 computing 2x slower (the test-only ``data.test_slow_rank`` / ``data.test_slowdown``), once with
``data.shares: equal`` and once with ``adaptive``, repeated ``--rounds`` times in alternation, plus a run without
the slow rank for reference. It prints, per run, the mean epoch time over epochs 1.. (epoch 0 runs with equal shares
in both: nothing is measured before it), the samples each rank read per epoch, the shares, and whether the ranks
ended with identical parameters; then the ratio of the adaptive to the equal epoch time (target: <= 0.75).

Then a growing batch (``data.batch_growth``: x2 at epoch 2, x4 at epoch 4, learning rate by ``sqrt``) against a
constant batch: all-reduce rounds per epoch (counted: gradient tensors handed to Horovod over tensors per round) and
the test accuracy.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


# Enough compute per step (a 64-1024-10 MLP, 2048 samples per rank) that a rank's speed, not the all-reduce or
# Python's per-step overhead, decides the step time: what unequal shares can fix.
SAMPLES = 65536


def config(framework: str, epochs: int, **data):
    from hvdsync.config import Config

    return Config.from_dict({
        "data": {"dataset": "synthetic", "synthetic_samples": SAMPLES, "batch_size": 2048, **data},
        "train": {"framework": framework, "epochs": epochs, "hidden": 1024, "lr": 0.05},
        "tracking": {"enabled": False}, "monitor": {"every": 0}})


def later_epoch_seconds(result: dict) -> float:
    return statistics.mean(h["epoch_seconds"] for h in result["history"][1:])


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--framework", default="torch", choices=["torch", "tensorflow"])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)

    from hvdsync.launch import train_many

    slow = {"test_slow_rank": 1, "test_slowdown": 2.0}
    cfgs, names = [config(args.framework, args.epochs)], ["no slow rank"]
    for _ in range(args.rounds):
        cfgs += [config(args.framework, args.epochs, shares="equal", **slow),
                 config(args.framework, args.epochs, shares="adaptive", **slow)]
        names += ["equal, rank 1 2x slower", "adaptive, rank 1 2x slower"]
    growth = {2: 2, 4: 4}
    cfgs += [config(args.framework, 6), config(args.framework, 6, batch_growth=growth)]
    results = train_many(cfgs)

    print(f"{args.framework}, 2 workers, MLP 64-1024-10 on {SAMPLES} synthetic samples, batch 2048 per rank, {args.epochs} epochs\n")
    print(f"{'run':<28} {'epoch s (1..)':>13} {'samples/rank (last epoch)':>26} {'shares (last)':>16} {'equal params':>12}")
    out: dict = {"framework": args.framework, "runs": []}
    for name, r in zip(names, results):
        last = r["history"][-1]
        samples = last.get("rank_samples", ["-", "-"])
        shares = last.get("shares")
        row = {"run": name, "epoch_seconds": later_epoch_seconds(r), "rank_samples": samples, "shares": shares,
               "param_spread": r["param_spread"]}
        out["runs"].append(row)
        share_text = "/".join(f"{s:.2f}" for s in shares) if shares else "-"
        print(f"{name:<28} {row['epoch_seconds']:>13.3f} {str(samples):>26} {share_text:>16} "
              f"{str(r['param_spread'] == 0.0):>12}")
    equal = [r["epoch_seconds"] for r in out["runs"] if r["run"].startswith("equal")]
    adaptive = [r["epoch_seconds"] for r in out["runs"] if r["run"].startswith("adaptive")]
    out["ratio_adaptive_to_equal"] = statistics.mean(a / e for a, e in zip(adaptive, equal))
    print("\nepoch time, adaptive / equal shares (rounds side by side): "
          + ", ".join(f"{a / e:.2f}" for a, e in zip(adaptive, equal))
          + f"; mean {out['ratio_adaptive_to_equal']:.2f} ({1 - out['ratio_adaptive_to_equal']:.0%} lower)")

    constant, grown = results[-2], results[-1]
    out["growth"] = {"schedule": growth, "constant_rounds": [h["sync_rounds"] for h in constant["history"]],
                     "growth_rounds": [h["sync_rounds"] for h in grown["history"]],
                     "constant_accuracy": constant["test_accuracy"], "growth_accuracy": grown["test_accuracy"]}
    print(f"\ngrowing batch {growth} (lr x sqrt(factor)) vs constant, all-reduce rounds per epoch (counted):")
    print(f"  constant: {[int(x) for x in out['growth']['constant_rounds']]}  accuracy {constant['test_accuracy']:.4f}")
    print(f"  growing:  {[int(x) for x in out['growth']['growth_rounds']]}  accuracy {grown['test_accuracy']:.4f}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
