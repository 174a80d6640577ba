"""Codecs against ``none`` on digits over several seeds: how far apart two single runs can land by chance.

    python benchmarks/compression.py seeds                             # top-k with SGD momentum 0.9 (lr 0.1)
    python benchmarks/compression.py seeds --codecs powersgd:2 --lr 0.5 --momentum 0   # tests/parallel's PowerSGD run
    python benchmarks/compression.py seeds --frameworks torch --seeds 0,1,2,3,4

On digits one run's final accuracy moves by a point or more from seed to seed (a seed picks the initial weights
and the sample order), and with plain SGD at a large learning rate ``none`` itself swings by tens of points
between epochs: a codec's "gap to none" from one run can be chance. This trains ``none`` and each codec from the
same seeds (one job of 2 workers per framework, :func:`hvdsync.launch.local.train_many`) and prints, per seed, the final
test accuracy and the difference to ``none`` from the same seed, then the mean over seeds. A codec spec may end
in ``/nomc`` (``sync.momentum_correction: false``) or ``/noef`` (``sync.error_feedback: false``).
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def configs(framework: str, codecs: list[str], seeds: list[int], lr: float, momentum: float, epochs: int) -> list:
    from hvdsync.config import Config

    out = []
    for seed in seeds:
        for spec in ["none", *codecs]:
            codec, _, flag = spec.partition("/")
            sync = {"compression": codec, "momentum_correction": flag != "nomc", "error_feedback": flag != "noef"}
            train = {"framework": framework, "np": 2, "epochs": epochs, "optimizer": "sgd", "lr": lr,
                     "momentum": momentum, "seed": seed}
            out.append((spec, seed, Config.from_dict({"sync": sync, "train": train, "tracking": {"enabled": False}})))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="compression.py seeds", description=__doc__.split("\n")[0])
    p.add_argument("--frameworks", default="torch,tensorflow")
    p.add_argument("--codecs", default="topk:0.01,topk:0.01/nomc", help="comma-separated; none is always run")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--json", metavar="PATH", help="also write every final accuracy as JSON")
    args = p.parse_args(argv)
    codecs = [c.strip() for c in args.codecs.split(",") if c.strip() and c.strip() != "none"]
    seeds = [int(s) for s in args.seeds.split(",")]

    from hvdsync import launch

    print(f"digits, MLP, 2 workers, SGD lr {args.lr} momentum {args.momentum}, {args.epochs} epochs; final test "
          "accuracy (difference to none from the same seed)")
    print(f"{'framework':<10} {'codec':<18} " + " ".join(f"{'seed ' + str(s):>16}" for s in seeds)
          + f" {'mean':>16}")
    doc = {"lr": args.lr, "momentum": args.momentum, "epochs": args.epochs, "seeds": seeds, "accuracy": {}}
    for framework in args.frameworks.split(","):
        runs = configs(framework.strip(), codecs, seeds, args.lr, args.momentum, args.epochs)
        results = launch.train_many([cfg for _, _, cfg in runs])
        acc = {(spec, seed): r["test_accuracy"] for (spec, seed, _), r in zip(runs, results)}
        doc["accuracy"][framework.strip()] = {spec: [acc[(spec, s)] for s in seeds] for spec in ["none", *codecs]}
        for spec in ["none", *codecs]:
            cells, deltas = [], []
            for s in seeds:
                delta = acc[(spec, s)] - acc[("none", s)]
                deltas.append(delta)
                cells.append(f"{acc[(spec, s)]:.4f}" + ("" if spec == "none" else f" ({100 * delta:+.1f})"))
            mean = statistics.fmean(acc[(spec, s)] for s in seeds)
            mean_cell = f"{mean:.4f}" + ("" if spec == "none" else f" ({100 * statistics.fmean(deltas):+.1f})")
            print(f"{framework:<10} {spec:<18} " + " ".join(f"{c:>16}" for c in cells) + f" {mean_cell:>16}")
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1))
    return 0
