"""Where the epoch of ``shares.py`` goes, step by step: every phase of every step on both ranks, with the test
slowdown's busy time apart from the work.

    python benchmarks/shares_timeline.py --framework tensorflow --hidden 4096
    python benchmarks/shares_timeline.py --framework torch --hidden 4096 --json timeline.json

One job of 2 workers trains the three runs of :mod:`shares` (no slow rank; rank 1 2x slower with equal shares;
with adaptive shares). Each worker records the start and end of every phase (``data``, ``compute``, ``sync_wait``,
``update``), of the slowdown's busy wait inside rank 1's compute phase and of the evaluation; the clocks are the
machine's monotonic clock, so both ranks' records line up. Printed per run and epoch (1..), per rank: work seconds
(compute without the busy wait) and microseconds per sample, busy, all-reduce wait, update, evaluation; then the
median step time (rank 0, from one step's start to the next) and, per step, how much earlier rank 0 reached the
all-reduce than rank 1 (what unequal shares should bring to zero) and how long the all-reduce took once both had.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

PHASE_NAMES = ("data", "compute", "sync_wait", "update")


def worker(cfg_dicts: list[dict]) -> list[list]:
    """In each worker: train every config with the phase timer's intervals recorded; returns the records per run."""
    import contextlib
    import importlib
    import time

    from hvdsync.config import Config
    from hvdsync import datasets
    from hvdsync.core.telemetry import profiling
    from hvdsync.core.train.loop import Callback, array_evaluator, fit_loop
    from hvdsync.launch.local import ADAPTERS

    log: list = []
    # Instrumentation for this measurement only: wrap the timer's phase and the slowdown's busy wait so that each
    # records (name, start, end[, samples]).
    busy_until, phase = profiling._busy_until, profiling.PhaseTimer.phase

    def timed_busy(deadline):
        t = time.perf_counter()
        busy_until(deadline)
        log.append(("busy", t, time.perf_counter()))

    @contextlib.contextmanager
    def timed_phase(self, name, samples=None):
        t = time.perf_counter()
        with phase(self, name, samples):
            yield
        log.append((name, t, time.perf_counter(), samples or 0))

    profiling._busy_until, profiling.PhaseTimer.phase = timed_busy, timed_phase

    class Marks(Callback):
        def on_epoch_begin(self, ctx):
            log.append(("epoch_begin", time.perf_counter(), ctx.epoch))

        def on_epoch_end(self, ctx):
            log.append(("epoch_end", time.perf_counter(), ctx.epoch))

        def on_step_begin(self, ctx):
            log.append(("step_begin", time.perf_counter(), ctx.step))

    runs = []
    for cfg_dict in cfg_dicts:
        cfg = Config.from_dict(cfg_dict)
        adapter = importlib.import_module(ADAPTERS[cfg.train.framework])
        adapter.init(cfg)
        data = datasets.load(cfg.data, cfg.train.seed)
        backend = adapter.build(cfg, data)
        scores = array_evaluator(backend, data)

        def evaluate(scores=scores):
            t = time.perf_counter()
            out = scores()
            log.append(("eval", t, time.perf_counter()))
            return out

        log.clear()
        fit_loop(cfg, backend, data, evaluate, callbacks=[Marks()])
        runs.append(list(log))
    return runs


def _epoch(log: list, epoch: int) -> tuple[float, float, list]:
    begin = next(e[1] for e in log if e[0] == "epoch_begin" and e[2] == epoch)
    end = next(e[1] for e in log if e[0] == "epoch_end" and e[2] == epoch)
    return begin, end, [e for e in log if begin <= e[1] <= end and e[0] not in ("epoch_begin", "epoch_end")]


def _steps(events: list) -> list[dict]:
    """Per step: the compute phase's samples, when the rank reached the all-reduce and when the all-reduce ended."""
    steps, current = [], {}
    for e in events:
        if e[0] == "compute":
            current = {"n": e[3], "arrive": e[2]}
        elif e[0] == "sync_wait" and current:
            current["done"] = e[2]
            steps.append(current)
            current = {}
    return steps


def summarise(name: str, ranks: list[list], epochs: int) -> dict:
    """Print and return the per-epoch, per-rank breakdown of one run (``ranks[r]``: rank r's record)."""
    print(f"== {name}")
    gaps, reduce_ms, step_ms = [], [], []
    for epoch in range(1, epochs):
        parts = []
        per_rank = []
        for r, log in enumerate(ranks):
            begin, end, events = _epoch(log, epoch)
            total = {k: sum(e[2] - e[1] for e in events if e[0] == k) for k in (*PHASE_NAMES, "busy", "eval")}
            samples = sum(e[3] for e in events if e[0] == "compute")
            work = total["compute"] - total["busy"]
            per_rank.append(_steps(events))
            parts.append(f"r{r} n={samples} work {work:.3f} ({1e6 * work / max(1, samples):.1f} us/sample) busy "
                         f"{total['busy']:.3f} wait {total['sync_wait']:.3f} update {total['update']:.3f} "
                         f"eval {total['eval']:.3f}")
            if r == 0:
                starts = [e[1] for e in events if e[0] == "step_begin"]
                step_ms += [1e3 * (b - a) for a, b in zip(starts, starts[1:])]
                wall = end - begin
        for s0, s1 in zip(*per_rank):
            gaps.append(1e3 * (s1["arrive"] - s0["arrive"]))
            reduce_ms.append(1e3 * (min(s0["done"], s1["done"]) - max(s0["arrive"], s1["arrive"])))
        print(f" epoch {epoch}: {wall:.3f} s | " + " | ".join(parts))
    out = {"median_step_ms": statistics.median(step_ms), "median_rank1_later_ms": statistics.median(gaps),
           "median_allreduce_ms": statistics.median(reduce_ms)}
    print(f" median step {out['median_step_ms']:.1f} ms; rank 1 reaches the all-reduce "
          f"{out['median_rank1_later_ms']:.1f} ms after rank 0 (median); the all-reduce then takes "
          f"{out['median_allreduce_ms']:.1f} ms (median)")
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--framework", default="tensorflow", choices=["torch", "tensorflow"])
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--json", help="also write the raw records to this file")
    args = parser.parse_args(argv)

    from hvdsync.launch.local import run
    from shares import config

    slow = {"test_slow_rank": 1, "test_slowdown": 2.0}
    runs = {"no slow rank": config(args.framework, args.epochs, args.hidden),
            "equal, rank 1 2x slower": config(args.framework, args.epochs, args.hidden, shares="equal", **slow),
            "adaptive, rank 1 2x slower": config(args.framework, args.epochs, args.hidden, shares="adaptive", **slow)}
    records = run(worker, args=([c.to_dict() for c in runs.values()],), np=2, progress=False)
    print(f"{args.framework}, MLP 64-{args.hidden}-10, 2 workers, epochs 1-{args.epochs - 1}")
    out = {name: summarise(name, [records[r][i] for r in range(2)], args.epochs) for i, name in enumerate(runs)}
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": out, "records": records}))
    return out


if __name__ == "__main__":
    main()
