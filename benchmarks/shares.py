"""Straggler-aware shares and a growing batch, side by side on 2 local workers: epoch time, samples, all-reduces.

    python benchmarks/shares.py                          # PyTorch and TensorFlow, rounds interleaved (part compare)
    python benchmarks/shares.py --framework tensorflow   # one framework
    python benchmarks/shares.py --rounds 3 --json shares.json
    python benchmarks/shares.py --hidden 4096            # 4x the compute per sample: the fixed part of an epoch shrinks
    python benchmarks/shares.py timeline --framework tensorflow --hidden 4096   # every phase of every step
    python benchmarks/shares.py --record quiet --framework tensorflow --rounds 4 --epochs 6 --hidden 4096

The suite's parts: ``compare`` (the default, below) and ``timeline`` (:mod:`hvdlab.bench.shares_timeline`: where
the epoch of the same runs goes, every phase of every step on both ranks, the straggler's busy time apart); both
take their setup from :mod:`hvdlab.bench.shares_common`. ``PART --help`` gives a part's options.

Per framework and round, one job of 2 Horovod workers (:func:`worker`, through :func:`hvdsync.launch.run`) trains the
same model from the same start, with rank 1 computing 2x slower (the lab's straggler,
:class:`hvdlab.straggler.SlowRank`, passed to ``fit`` as its phase timer and a callback: busy in proportion to its
samples before each forward pass, the same in both frameworks), once with ``data.shares: equal`` and once with
``adaptive``, plus a run without the slow rank for reference. The rounds alternate the frameworks (torch, tensorflow,
torch, ...), so both see the same machine, and the order of the equal and adaptive runs (equal first in even rounds,
adaptive first in odd ones), so that a drift of the machine during a job favours neither. It prints, per run, the mean
epoch time over epochs 1.. (epoch 0 runs with equal shares in both: nothing is measured before it), the samples each
rank read per epoch, the shares, whether the ranks ended with identical parameters, and each rank's phases and cost per
sample; then the ratio of the adaptive to the equal epoch time (target: <= 0.75) and its *bound*: what perfectly
balanced shares would give, from the equal run's own figures (each rank's measured throughput gives the balanced compute
time; the evaluation, whose test set the shares cut too, shrinks in proportion; the all-reduce and the update do not).
The same bound from the adaptive run's own figures says how much its shares left to win at the speeds its ranks had
(1.00: nothing).

Then a growing batch (``data.batch_growth``: x2 at epoch 2, x4 at epoch 4, learning rate by ``sqrt``) against a
constant batch, in each framework's last job: all-reduce rounds per epoch (counted: gradient tensors handed to
Horovod over tensors per round) and the test accuracy.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from hvdlab.bench import shares_timeline, suite
from hvdlab.bench.shares_common import SAMPLES, SLOWDOWN, batch_for, config


def later_epoch_seconds(result: dict) -> float:
    return statistics.mean(h["epoch_seconds"] for h in result["history"][1:])


def balanced_bound(run: dict) -> float:
    """What perfect shares would make of ``run`` (equal shares; or adaptive ones, to see what their shares left to
    win): per epoch 1.., the work at the ranks' measured throughputs split to finish together, the evaluation shrunk
    in the same proportion (its test set is cut by the same shares, and the slowed rank scores as slowly as it
    computes), plus the part of the epoch that is neither (all-reduce, update), over the measured epoch time; the
    mean over epochs."""
    ratios = []
    for h in run["history"][1:]:
        # Each rank's throughput in this epoch: its samples over its data + compute seconds (the phase timers).
        samples = h["rank_samples"]
        rates = [n / (p["data"] + p["compute"]) for n, p in zip(samples, h["rank_phase_seconds"])]
        work = max(n / r for n, r in zip(samples, rates))
        balanced = sum(samples) / sum(rates)
        rest = max(0.0, h["epoch_seconds"] - work - h["eval_seconds"])
        ratios.append((balanced + h["eval_seconds"] * balanced / work + rest) / h["epoch_seconds"])
    return statistics.mean(ratios)


def worker(runs: list[tuple[dict, float]]) -> list[dict]:
    """In each worker: train every ``(config, slowdown)`` in turn (one Horovod start-up for all), rank 1 computing
    ``slowdown`` times slower (1.0: not slowed); returns this rank's results (:meth:`FitResult.to_dict`)."""
    from hvdlab.straggler import SlowRank
    from hvdsync.config import Config
    from hvdsync.core.train.adaptive import AdaptiveShares
    from hvdsync.launch.worker import adapter

    out = []
    for cfg_dict, slowdown in runs:
        cfg = Config.from_dict(cfg_dict)
        slow = SlowRank(rank=1, factor=slowdown)
        # Equal shares with a slow rank are measured too (samples, throughput and phases per rank and epoch), for
        # the comparison; adaptive shares measure themselves.
        measure = [AdaptiveShares(adapt=False)] if slowdown > 1.0 and cfg.data.shares == "equal" else []
        out.append(adapter(cfg).fit(cfg, callbacks=[slow, *measure], timer=slow).to_dict())
    return out


def framework_job(framework: str, epochs: int, growth: dict | None, hidden: int = 1024,
                  adaptive_first: bool = False, samples: int = SAMPLES) -> dict:
    """One job of workers: a reference without the slow rank, equal and adaptive shares with rank 1 2x slower
    (``adaptive_first``: in that order reversed), and (``growth``) a constant against a growing batch."""
    from hvdsync import launch

    runs = {"equal": (config(framework, epochs, hidden, samples, shares="equal"), SLOWDOWN),
            "adaptive": (config(framework, epochs, hidden, samples, shares="adaptive"), SLOWDOWN)}
    order = ["adaptive", "equal"] if adaptive_first else ["equal", "adaptive"]
    cfgs = [(config(framework, epochs, hidden, samples), 1.0)] + [runs[k] for k in order]
    if growth:
        cfgs += [(config(framework, 6, hidden, samples), 1.0),
                 (config(framework, 6, hidden, samples, batch_growth=growth), 1.0)]
    results = launch.run(worker, args=([(c.to_dict(), slowdown) for c, slowdown in cfgs],), np=2,
                         sync=cfgs[0][0].sync, progress=False)[0]
    return {"reference": results[0], **dict(zip(order, results[1:3])), "growth": results[3:],
            "adaptive_first": adaptive_first}


def phase_means(r: dict) -> list[dict] | None:
    """Per rank, the mean seconds per epoch (1..) of each phase (``rank_phase_seconds``, recorded by the shares
    callback: with a slow rank only), and the evaluation's (``eval_seconds``, the slowest rank's)."""
    later = [h for h in r["history"][1:] if "rank_phase_seconds" in h]
    if not later:
        return None
    ranks = range(len(later[0]["rank_phase_seconds"]))
    means = [{k: statistics.mean(h["rank_phase_seconds"][i][k] for h in later)
              for k in later[0]["rank_phase_seconds"][i]} for i in ranks]
    for m in means:
        m["evaluate"] = statistics.mean(h["eval_seconds"] for h in later)
    return means


def per_sample_us(r: dict) -> list[float] | None:
    """Per rank, the mean over epochs 1.. of its data + compute seconds per sample read, in microseconds (the
    slowdown included): what a rank's work costs while the other rank computes (adaptive) or mostly waits (equal)."""
    later = [h for h in r["history"][1:] if "rank_phase_seconds" in h]
    if not later:
        return None
    return [1e6 * statistics.mean((h["rank_phase_seconds"][i]["data"] + h["rank_phase_seconds"][i]["compute"])
                                  / h["rank_samples"][i] for h in later) for i in range(len(later[0]["rank_samples"]))]


def run_row(name: str, r: dict) -> dict:
    last = r["history"][-1]
    return {"run": name, "epoch_seconds": later_epoch_seconds(r), "rank_samples": last.get("rank_samples", ["-", "-"]),
            "shares": last.get("shares"), "share_history": [h.get("shares") for h in r["history"]],
            "param_spread": r["param_spread"], "phases": phase_means(r), "us_per_sample": per_sample_us(r),
            "eval_seconds": statistics.mean(h["eval_seconds"] for h in r["history"][1:])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="shares.py compare", description=__doc__.splitlines()[0],
                                     epilog=suite.RECORD_HELP)
    parser.add_argument("--framework", default="both", choices=["both", "torch", "tensorflow"])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=1024,
                        help="the MLP's hidden width: more compute per sample, so less of the epoch is fixed cost")
    parser.add_argument("--samples", type=int, default=SAMPLES,
                        help="synthetic samples (a quarter is the test set; batch: a 16th of them, at most 2048)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)

    frameworks = ["torch", "tensorflow"] if args.framework == "both" else [args.framework]
    growth = {2: 2, 4: 4}
    jobs: dict[str, list[dict]] = {f: [] for f in frameworks}
    for i in range(args.rounds):
        for framework in frameworks:  # alternating: both frameworks see the same state of the machine
            # Odd rounds run adaptive before equal shares: a machine that drifts during a job (it does here, by 10%
            # and more within minutes) then favours neither.
            jobs[framework].append(framework_job(framework, args.epochs, growth if i == args.rounds - 1 else None,
                                                 args.hidden, adaptive_first=i % 2 == 1, samples=args.samples))

    out: dict = {"frameworks": {}}
    for framework, rounds in jobs.items():
        print(f"\n{framework}, 2 workers, MLP 64-{args.hidden}-10 on {args.samples} synthetic samples, batch "
              f"{batch_for(args.samples)} per rank, "
              f"{args.epochs} epochs")
        print(f"{'run':<28} {'epoch s (1..)':>13} {'samples/rank (last epoch)':>26} {'shares (per epoch)':>26} "
              f"{'equal params':>12}")
        rows = []
        for job in rounds:
            for name, key in (("no slow rank", "reference"), ("equal, rank 1 2x slower", "equal"),
                              ("adaptive, rank 1 2x slower", "adaptive")):
                row = run_row(name, job[key])
                rows.append(row)
                shares = " ".join(f"{s[0]:.2f}" for s in row["share_history"] if s) or "-"
                print(f"{name:<28} {row['epoch_seconds']:>13.3f} {str(row['rank_samples']):>26} {shares:>26} "
                      f"{str(row['param_spread'] == 0.0):>12}")
        print("seconds per epoch (1..), per rank r0 / r1: data+compute (the slowdown included), all-reduce wait, "
              "update; evaluation")
        for row in rows:
            if row["phases"]:
                p = row["phases"]
                print(f"  {row['run']:<28} compute {p[0]['data'] + p[0]['compute']:.3f} / "
                      f"{p[1]['data'] + p[1]['compute']:.3f}  wait {p[0]['sync_wait']:.3f} / {p[1]['sync_wait']:.3f}  "
                      f"update {p[0]['update']:.3f} / {p[1]['update']:.3f}  evaluate {row['eval_seconds']:.3f}  "
                      f"us/sample {row['us_per_sample'][0]:.1f} / {row['us_per_sample'][1]:.1f}")
            else:
                print(f"  {row['run']:<28} evaluate {row['eval_seconds']:.3f}")
        ratios = [later_epoch_seconds(j["adaptive"]) / later_epoch_seconds(j["equal"]) for j in rounds]
        bounds = [balanced_bound(j["equal"]) for j in rounds]
        # The same bound from the adaptive run's own figures: 1.0 when its shares were perfect for the speeds the
        # ranks had in that run (both computing at once), lower by what imperfect shares cost.
        own = [balanced_bound(j["adaptive"]) for j in rounds]
        result = {"runs": rows, "ratios": ratios, "ratio_adaptive_to_equal": statistics.mean(ratios),
                  "bounds": bounds, "bound": statistics.mean(bounds), "adaptive_own_bounds": own}
        firsts = ["adaptive first" if j["adaptive_first"] else "equal first" for j in rounds]
        result["order"] = firsts
        print(f"epoch time, adaptive / equal shares (same job): "
              f"{', '.join(f'{r:.2f} ({o})' for r, o in zip(ratios, firsts))}; mean "
              f"{result['ratio_adaptive_to_equal']:.2f} ({abs(1 - result['ratio_adaptive_to_equal']):.0%} "
              f"{'lower' if result['ratio_adaptive_to_equal'] <= 1 else 'higher'}); "
              f"bound with perfect shares: {', '.join(f'{b:.2f}' for b in bounds)}")
        print(f"adaptive runs against perfect shares at their own ranks' speeds: {', '.join(f'{b:.2f}' for b in own)} "
              "(1.00: the shares left nothing to win)")
        constant, grown = rounds[-1]["growth"]
        result["growth"] = {"schedule": growth, "constant_rounds": [h["sync_rounds"] for h in constant["history"]],
                            "growth_rounds": [h["sync_rounds"] for h in grown["history"]],
                            "constant_accuracy": constant["test_accuracy"], "growth_accuracy": grown["test_accuracy"]}
        print(f"growing batch {growth} (lr x sqrt(factor)) vs constant, all-reduce rounds per epoch (counted):")
        print(f"  constant: {[int(x) for x in result['growth']['constant_rounds']]}  "
              f"accuracy {constant['test_accuracy']:.4f}")
        print(f"  growing:  {[int(x) for x in result['growth']['growth_rounds']]}  accuracy {grown['test_accuracy']:.4f}")
        out["frameworks"][framework] = result
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


SUITE_PARTS = {"compare": suite.Part(main, "Equal against adaptive shares with rank 1 2x slower on 2 local workers, "
                                           "the bound of perfect shares, and a growing batch's counted all-reduces."),
               "timeline": suite.Part(shares_timeline.main, suite.first_line(shares_timeline.__doc__))}

if __name__ == "__main__":
    sys.exit(suite.run(__file__, SUITE_PARTS, default="compare", doc=__doc__))
