"""Where the epoch of ``shares.py`` goes, step by step: every phase of every step on both ranks, with the simulated
straggler's busy time apart from the work.

    python benchmarks/shares.py timeline --framework tensorflow --hidden 4096
    python benchmarks/shares.py timeline --framework torch --hidden 4096 --json timeline.json

One job of 2 workers trains the three runs of ``shares.py compare`` (their setup: :mod:`hvdlab.bench.shares_common`; no
slow rank; rank 1 2x slower with equal shares; with adaptive shares). Each worker records, through the timer and
callback it passes in (a recording subclass of :class:`hvdlab.straggler.SlowRank`), the start and end of every phase
(``data``, ``compute``, ``sync_wait``, ``update``), of the slowdown's busy wait inside rank 1's compute phase and of the
evaluation; the clocks are the machine's monotonic clock, so both ranks' records line up. Printed per run and epoch
(1..), per rank: work seconds (compute without the busy wait) and microseconds per sample, busy, all-reduce wait,
update, evaluation; then the median step time (rank 0, from one step's start to the next) and, per step, how much
earlier rank 0 reached the all-reduce than rank 1 (what unequal shares should bring to zero) and how long the all-reduce
took once both had.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from hvdlab.bench.shares_common import SLOWDOWN, config

PHASE_NAMES = ("data", "compute", "sync_wait", "update")


def worker(runs: list[tuple[dict, float]]) -> list[list]:
    """In each worker: train every ``(config, slowdown)`` (rank 1 ``slowdown`` times slower; 1.0: not slowed) with
    every phase, busy wait and evaluation recorded; returns the records per run."""
    import contextlib
    import time

    from hvdlab.straggler import SlowRank
    from hvdsync import datasets
    from hvdsync.config import Config
    from hvdsync.core.train.adaptive import AdaptiveShares
    from hvdsync.core.train.callbacks import Callback
    from hvdsync.fitting import fit_loop
    from hvdsync.launch.worker import adapter as adapter_of

    log: list = []

    class Timed(SlowRank):
        """The lab's straggler (on every rank, slowing rank 1 only), recording ``(name, start, end[, samples])`` of
        each phase, of the evaluation, and of each busy wait: ``busy`` inside a compute phase, ``eval_busy`` after
        the evaluation (not work that a compute phase did)."""

        where, inside, cursor = "", False, 0.0

        @contextlib.contextmanager
        def phase(self, name, samples=None):
            t, self.where, self.inside, recorded = time.perf_counter(), name, True, self.seconds[name]
            try:
                with super().phase(name, samples) as span:
                    yield span
            finally:
                self.inside = False
            # A phase timed by another clock (TensorFlow's one-graph step, which also all-reduced and updated) ended
            # its recorded seconds after it began; the phases the adapter adds next follow it.
            self.cursor = time.perf_counter() if span.seconds is None else t + self.seconds[name] - recorded
            log.append((name, t, self.cursor, samples or 0))

        def add(self, name, seconds):
            super().add(name, seconds)
            if not self.inside:  # measured by the graph's clock, right after the phase before it
                log.append((name, self.cursor, self.cursor + seconds, 0))
                self.cursor += seconds

        def on_evaluate_begin(self, ctx):
            self.eval_start = time.perf_counter()
            super().on_evaluate_begin(ctx)

        def on_evaluate_end(self, ctx):
            log.append(("eval", self.eval_start, time.perf_counter()))
            self.where = "eval"
            super().on_evaluate_end(ctx)

        def busy(self, seconds):
            t = time.perf_counter()
            took = super().busy(seconds)
            log.append(("busy" if self.where == "compute" else "eval_busy", t, time.perf_counter()))
            return took

    class Marks(Callback):
        def on_epoch_begin(self, ctx):
            log.append(("epoch_begin", time.perf_counter(), ctx.epoch))

        def on_epoch_end(self, ctx):
            log.append(("epoch_end", time.perf_counter(), ctx.epoch))

        def on_step_begin(self, ctx):
            log.append(("step_begin", time.perf_counter(), ctx.step))

    out = []
    for cfg_dict, slowdown in runs:
        cfg = Config.from_dict(cfg_dict)
        adapter = adapter_of(cfg)
        adapter.init(cfg)
        data = datasets.load(cfg.data, cfg.train.seed)
        timer = Timed(rank=1, factor=slowdown)
        backend = adapter.build(cfg, data, timer=timer)
        # As in compare: equal shares with a slow rank are measured per rank too (one all-gather per epoch).
        measure = [AdaptiveShares(adapt=False)] if slowdown > 1.0 and cfg.data.shares == "equal" else []
        log.clear()
        fit_loop(cfg, backend, data, callbacks=[timer, Marks(), *measure])
        out.append(list(log))
    return out


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="shares.py timeline", description=__doc__.splitlines()[0])
    parser.add_argument("--framework", default="tensorflow", choices=["torch", "tensorflow"])
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--json", help="also write the raw records to this file")
    args = parser.parse_args(argv)

    from hvdsync.launch.local import run

    runs = {"no slow rank": (config(args.framework, args.epochs, args.hidden), 1.0),
            "equal, rank 1 2x slower": (config(args.framework, args.epochs, args.hidden, shares="equal"), SLOWDOWN),
            "adaptive, rank 1 2x slower": (config(args.framework, args.epochs, args.hidden, shares="adaptive"),
                                           SLOWDOWN)}
    records = run(worker, args=([(c.to_dict(), slowdown) for c, slowdown in runs.values()],), np=2, progress=False)
    print(f"{args.framework}, MLP 64-{args.hidden}-10, 2 workers, epochs 1-{args.epochs - 1}")
    out = {name: summarise(name, [records[r][i] for r in range(2)], args.epochs) for i, name in enumerate(runs)}
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": out, "records": records}))
    return 0
