"""Every gradient codec side by side on 2 local workers: bytes on the wire, step time, accuracy, ratios to ``none``,
for two models and both frameworks, in one run.

    python benchmarks/compression.py                       # torch and tensorflow, the wide MLP and the small CNN
    python benchmarks/compression.py --frameworks torch --models mlp
    python benchmarks/compression.py --json compression.json
    python benchmarks/compression.py --quick               # small models, 1 epoch: every codec's path in minutes
    python benchmarks/compression.py seeds                 # accuracy against none over seeds: what is chance
    python benchmarks/compression.py --record quiet        # keep it: results/compression/<date>-codecs-quiet.*
    make bench                                             # allreduce.py, then this (recorded)

Two parts: ``codecs`` (the default, below) and ``seeds`` (:mod:`hvdlab.bench.codec_seeds`: each codec's final
accuracy against ``none`` from the same seeds, over several seeds); ``PART --help`` gives a part's options.

Per framework, one job of 2 Horovod workers (Gloo over loopback) trains each model, from the same start, on the same
samples, for the same number of steps, once per codec (:func:`hvdsync.launch.local.train_many`). Per run it prints:

* bytes one rank handed to Horovod per step, *counted* by hvdsync's wire counter (values and indices, scales,
  PowerSGD's factors), checked against the codec's formula (the run fails if they differ);
* step time: the mean over steps of the slowest rank's step, epochs after the first (which includes warm-up);
  ``sync`` is the share of a step spent waiting for the reduction (encoding, transfer, decoding);
* test accuracy after the last epoch, and whether both ranks ended with identical parameters;
* the ratio of bytes and of step time to ``none`` (same framework, same model).

The models:

* ``mlp``: one hidden layer on a synthetic task (1,024 features, 4,096 hidden units, 10 classes): 4.2 M parameters,
  16.8 MB of float32 gradient per step against ~0.8 GFLOP of compute for a batch of 32, so the all-reduce
  dominates a step, as for a wide model on a slow network. Plain SGD (lr 0.1).
* ``cnn``: hvdsync's small residual CNN (width 16, two blocks: ~10 k parameters) on digits as 8x8 images: compute
  dominates, gradients are small. Adam (lr 0.01), so no momentum correction (it applies to SGD).

On 2 cores over loopback the transfer is a memory copy, and encoding (a top-k over 4 M values, a quantisation pass)
takes the same cores as the transfer: a codec pays off here only where it saves more copying than it costs in
compute.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from hvdlab.bench import codec_seeds, suite

CODECS = ["none", "fp16", "bf16", "topk:0.01", "randk:0.01", "int8", "powersgd:2"]


MODELS = ["mlp", "cnn"]


def model_settings(model: str, quick: bool) -> tuple[dict, dict]:
    """``(data, train)`` config sections for one of :data:`MODELS`."""
    if model == "mlp":
        data = ({"dataset": "synthetic", "synthetic_samples": 1024, "synthetic_features": 64, "batch_size": 32}
                if quick else
                {"dataset": "synthetic", "synthetic_samples": 2048, "synthetic_features": 1024, "batch_size": 32})
        return data, {"model": "mlp", "epochs": 1 if quick else 2, "hidden": 256 if quick else 4096,
                      "optimizer": "sgd", "momentum": 0.0, "lr": 0.1}
    # Adam, as the repo's own CNN checks: with SGD (lr 0.05-0.2, momentum 0.9) this CNN stayed near chance on
    # digits' raw 0-16 pixels within 6 epochs.
    return ({"dataset": "digits_images", "batch_size": 32},
            {"model": "cnn", "epochs": 1 if quick else 6, "hidden": 8 if quick else 16, "optimizer": "adam",
             "momentum": 0.9, "lr": 0.01})


def configs(framework: str, codecs: list[str], quick: bool, error_feedback: bool = True,
            models: list[str] = ("mlp",)) -> list:
    from hvdsync.config import Config

    out = []
    for model in models:
        data, train = model_settings(model, quick)
        out += [Config.from_dict({"sync": {"compression": c, "error_feedback": error_feedback}, "data": data,
                                  "train": {**train, "framework": framework, "np": 2}, "tracking": {"enabled": False}})
                for c in codecs]
    return out


def summarise(result: dict) -> dict:
    history = result["history"]
    steady = history[1:] or history
    step = statistics.fmean(h["step_seconds_max_rank"] for h in steady)
    phases = result["phase_seconds"]
    total = sum(phases.values()) or 1.0
    return {
        "framework": result["config"]["train"]["framework"],
        "model": result["config"]["train"]["model"],
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


def baseline(rows: list[dict], row: dict, same: tuple[str, ...]) -> dict:
    """The ``none`` run that ``row``'s ratios are to: the one that agrees with it on the keys ``same``."""
    return next(b for b in rows if b["compression"] == "none" and all(b[k] == row[k] for k in same))


def table(rows: list[dict]) -> str:
    """One table for all runs; each run's ratios are to ``none`` of the same framework and model."""
    lines = [f"{'framework':<10} {'model':<5} {'params':>9} {'codec':<12} {'bytes/step':>12} {'x fewer':>8} "
             f"{'step ms':>8} {'x time':>7} {'sync %':>7} {'accuracy':>9} {'ranks equal':>11}"]
    for r in rows:
        base = baseline(rows, r, ("framework", "model"))
        r["bytes_ratio"] = base["bytes_per_step"] / r["bytes_per_step"]
        r["time_ratio"] = r["step_ms"] / base["step_ms"]
        r["accuracy_delta"] = r["accuracy"] - base["accuracy"]
        lines.append(f"{r['framework']:<10} {r['model']:<5} {r['numel']:>9,} "
                     f"{r['compression']:<12} {r['bytes_per_step']:>12,.0f} {r['bytes_ratio']:>8.1f} "
                     f"{r['step_ms']:>8.1f} {r['time_ratio']:>7.2f} {100 * r['sync_share']:>7.1f} "
                     f"{r['accuracy']:>9.4f} {str(r['ranks_identical']):>11}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="compression.py codecs", description=__doc__.split("\n")[0],
                                epilog=suite.RECORD_HELP)
    p.add_argument("--frameworks", default="torch,tensorflow", help="comma-separated: torch, tensorflow")
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated: {', '.join(MODELS)}")
    p.add_argument("--codecs", default=",".join(CODECS), help="comma-separated sync.compression values")
    p.add_argument("--quick", action="store_true", help="small MLP, 1 epoch: exercises every path")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON")
    args = p.parse_args(argv)
    codecs = [c.strip() for c in args.codecs.split(",") if c.strip()]
    if "none" not in codecs:
        codecs.insert(0, "none")

    frameworks = [f.strip() for f in args.frameworks.split(",") if f.strip()]
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    bad = [x for x in frameworks if x not in ("torch", "tensorflow")] + [m for m in models if m not in MODELS]
    if bad:
        p.error(f"not allowed: {', '.join(bad)}; frameworks: torch, tensorflow; models: {', '.join(MODELS)}")

    from hvdsync import launch

    start = time.perf_counter()
    rows = []
    for framework in frameworks:   # one job of workers per framework (a process imports one of them)
        rows += [summarise(r) for r in launch.train_many(configs(framework, codecs, args.quick, models=models))]
    wrong = [f"{r['framework']} {r['model']} {r['compression']}" for r in rows
             if r["bytes_per_step"] != r["formula_bytes_per_step"]]
    if wrong:
        print(f"counted bytes differ from the codec formula for: {', '.join(wrong)}", file=sys.stderr)
        return 1
    for model in models:
        data, train = model_settings(model, args.quick)
        row = next(r for r in rows if r["model"] == model)
        optimizer = "Adam" if train["optimizer"] == "adam" else f"SGD momentum {train['momentum']}"
        print(f"{model}: {data['dataset']}, hidden {train['hidden']}, {row['numel']:,} parameters, {row['steps']} "
              f"steps of 2 x {data['batch_size']} samples per codec, {optimizer} lr {train['lr']}")
    print(f"2 workers (Gloo, loopback) per framework; {time.perf_counter() - start:.0f} s in all")
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"quick": args.quick, "rows": rows}, indent=2))
    return 0


SUITE_PARTS = {"codecs": suite.Part(main, "every codec on 2 workers: bytes per step (counted = formula), step time, "
                                         "accuracy, ratios to none"),
               "seeds": suite.Part(codec_seeds.main, suite.first_line(codec_seeds.__doc__))}

if __name__ == "__main__":
    sys.exit(suite.run(__file__, SUITE_PARTS, default="codecs", doc=__doc__))
