"""Allreduce time on 2 local processes, side by side in one run: raw Horovod, hvdsync, torch.distributed (all Gloo).

    python benchmarks/allreduce.py                      # 1, 16, 64 MiB; 30 timed iterations each, in 3 rounds
    python benchmarks/allreduce.py --json bench.json    # also write every figure as JSON
    python benchmarks/allreduce.py --sleep-wait         # add the (b') row: hvdsync waiting without spinning
    python benchmarks/allreduce.py --quick              # tiny sizes, 2 iterations: checks every path in ~1 minute
    python benchmarks/allreduce.py --set cycle_time_ms=2 --set fusion_threshold_mb=128   # hvdsync, other knobs
    python benchmarks/allreduce.py --horovod-build DIR  # add (b2): (b) on another Horovod build (e.g. before a patch)
    python benchmarks/allreduce.py --sleep-wait --alt-set cycle_time_ms=0.2   # add (b''): (b') with other knobs
    python benchmarks/allreduce.py --record quiet       # keep it: benchmarks/results/allreduce/<date>-quiet.{txt,json}
    make bench                                          # the first line, recorded

The variants, each started as its own pair of worker processes, alternated round by round:

  (a) Horovod's defaults: ``hvd.allreduce`` (out of place), Horovod's built-in knobs (128 MiB fusion buffer, 1 ms
      cycle, response cache of 1024): what a ``horovodrun`` script gets. The worker unsets ``HOROVOD_CYCLE_TIME``
      and ``HOROVOD_CACHE_CAPACITY`` before ``hvd.init()``: an unpatched ``horovod.runner.run`` sets both to
      ``(None,)``, which Horovod reads as 0 (docs/measurements/allreduce.md, "The launcher dropped two knobs").
  (b) hvdsync: workers from :func:`hvdsync.launch.local.run` with ``SyncConfig()`` (plus ``--set`` changes),
      :func:`hvdsync.torch.runtime.init`, and the in-place ``allreduce_async_`` + ``synchronize`` that
      ``hvd.DistributedOptimizer`` uses. Exactly what hvdsync's workers get; the run warns if the workers' knobs
      differ from the config's.
  (b') with ``--sleep-wait``: as (b), but waiting with ``hvd.poll`` + ``time.sleep(50 us)`` instead of Horovod's
      ``synchronize``, whose C++ loop spins on ``sched_yield`` (docs/measurements/allreduce.md, "Where the time goes").
  (b'') with ``--alt-set``: as (b'), with those SyncConfig changes on top of ``--set``: two settings of hvdsync side
      by side, interleaved with the others, e.g. the cycle time for small messages.
  (c) torch.distributed: ``dist.all_reduce`` on a Gloo process group (subprocesses, 127.0.0.1, a free port, lo).

All use one intra-op thread per process (what hvdsync sets on 2 cores and ``torchrun`` sets by default). Every
iteration's result is compared element by element with the exact sum or average; a wrong one fails the run.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

from hvdlab.bench import harness, report, suite

# Horovod's own defaults for (a), whether or not horovod.runner.run is the patched one (see the docstring).
HOROVOD_DEFAULTS = {"HOROVOD_CYCLE_TIME": None, "HOROVOD_CACHE_CAPACITY": None}


def variants(sync: dict, sleep_wait: bool = False, build: str | None = None,
             alt: dict | None = None) -> list[harness.Variant]:
    V = harness.Variant
    knobs = ", ".join(f"{k}={v}" for k, v in sync.items()) or "defaults"
    out = [
        V("horovod", "(a) Horovod defaults, hvd.allreduce", worker_env=HOROVOD_DEFAULTS, call="allreduce"),
        V("hvdsync", f"(b) hvdsync {knobs}", sync=sync, init="hvdsync", call="allreduce_"),
    ]
    if build:
        # The same as (b), but the workers import Horovod from another build (a `pip install --target` folder put
        # first on their path): two builds side by side in one run, e.g. before and after a patch.
        path = os.pathsep.join([str(Path(build).resolve()), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        out.append(V("hvdsync_build", "(b2) as (b), --horovod-build", sync=sync, init="hvdsync", call="allreduce_",
                     env={"PYTHONPATH": path}))
    if sleep_wait:
        out.append(V("hvdsync_sleep", "(b') hvdsync, poll + sleep wait", sync=sync, init="hvdsync",
                     call="allreduce_", wait="sleep"))
    if alt:
        changed = ", ".join(f"{k}={v}" for k, v in alt.items())
        out.append(V("hvdsync_alt", f"(b'') as (b'), {changed}", sync={**sync, **alt}, init="hvdsync",
                     call="allreduce_", wait="sleep"))
    out.append(V("torch", "(c) torch.distributed gloo", backend="torch"))
    return out


def parse_set(items: list[str]) -> dict:
    """``["cycle_time_ms=1"]`` -> ``{"cycle_time_ms": 1}`` (values as YAML), validated by SyncConfig."""
    import yaml

    from hvdsync.config import SyncConfig

    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--set: {item!r}: expected field=value, e.g. cycle_time_ms=1")
        out[key.strip()] = yaml.safe_load(value)
    known = {f.name for f in dataclasses.fields(SyncConfig)}
    for key in out:
        if key not in known:
            raise ValueError(f"--set: {key!r} is not a SyncConfig field; known: {', '.join(sorted(known))}")
    SyncConfig(**out)  # raises ConfigError naming the field and what is allowed
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=suite.RECORD_HELP)
    p.add_argument("--sizes", default="1,16,64", help="tensor sizes in MiB, comma-separated (default 1,16,64)")
    p.add_argument("--iters", type=int, default=30, help="timed iterations per size and variant (default 30)")
    p.add_argument("--rounds", type=int, default=3, help="rounds the iterations are spread over (default 3)")
    p.add_argument("--warmup", type=int, default=3, help="untimed iterations per size at each start (default 3)")
    p.add_argument("--op", choices=("average", "sum"), default="average",
                   help="reduction (default average, hvdsync's default; torch divides after its sum)")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="change a SyncConfig field for (b) and (b'), e.g. --set fusion_threshold_mb=128")
    p.add_argument("--sleep-wait", action="store_true",
                   help="add a (b') row: (b) waiting by hvd.poll + time.sleep instead of Horovod's spinning wait")
    p.add_argument("--horovod-build", metavar="DIR",
                   help="add a (b2) row: (b) with Horovod imported from DIR (pip install --no-deps --target DIR "
                        "<wheel>), to compare two builds in one run")
    p.add_argument("--alt-set", action="append", default=[], metavar="FIELD=VALUE",
                   help="add a (b'') row: (b') with these SyncConfig changes too, e.g. --alt-set cycle_time_ms=0.2")
    p.add_argument("--variants", default="",
                   help="run only these, comma-separated: horovod, hvdsync, hvdsync_build (with --horovod-build), "
                        "hvdsync_sleep (with --sleep-wait), torch")
    p.add_argument("--quick", action="store_true", help="tiny sizes, 2 iterations, 1 round: exercises every path")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON")
    p.add_argument("--inject-error", action="store_true",
                   help="self-test: corrupt one element of every result; the run must fail")
    args = p.parse_args(argv)
    if args.quick:
        args.sizes, args.iters, args.rounds, args.warmup = "0.01,0.25", 2, 1, 1
    if args.iters < 1 or args.rounds < 1 or args.warmup < 0:
        p.error("--iters and --rounds must be >= 1, --warmup >= 0")
    args.iters = -(-args.iters // args.rounds) * args.rounds  # the same number in every round
    try:
        sizes, sync, alt = report.parse_sizes(args.sizes), parse_set(args.set), parse_set(args.alt_set)
    except ValueError as exc:  # ConfigError included: it names the field
        p.error(str(exc))
    if args.horovod_build and not (Path(args.horovod_build) / "horovod" / "torch").is_dir():
        p.error(f"--horovod-build: {args.horovod_build!r} holds no horovod/torch package; expected a folder made by "
                "pip install --no-deps --target DIR <horovod wheel>")
    chosen = variants(sync, sleep_wait=args.sleep_wait, build=args.horovod_build, alt=alt)
    if args.variants:
        keep = set(args.variants.split(","))
        unknown = keep - {v.name for v in chosen}
        if unknown:
            p.error(f"--variants: unknown {sorted(unknown)}; choose from {[v.name for v in chosen]}")
        chosen = [v for v in chosen if v.name in keep]
    env = {harness.INJECT_ENV: "1"} if args.inject_error else {}

    info = report.machine()
    print(f"allreduce, {args.op}, float32, 2 local processes (Gloo over loopback); {args.iters} timed iterations per "
          f"size in {args.rounds} round(s), {args.warmup} warm-up per start; {info['cpus']} CPUs, load "
          f"average {info['load']}", flush=True)
    results = harness.run_rounds(chosen, sizes, args.iters, args.rounds, args.warmup, args.op, env=env,
                                 log=lambda s: print(s, flush=True))
    baseline = "torch" if "torch" in results else None
    summary = report.summarize(results, baseline)
    report.check_finite(summary)

    print()
    print(report.format_table(summary, {v.name: v.label for v in chosen}))
    print("knobs each variant's workers had at hvd.init():")
    for v in chosen:
        print(f"  {v.label:<38} {json.dumps(results[v.name]['seen'], sort_keys=True)}")
    seen_b = results.get("hvdsync", {}).get("seen", {})
    want_b = results.get("hvdsync", {}).get("knobs", {})
    lost = {k: (want_b[k], seen_b.get(k)) for k in want_b if seen_b.get(k) != want_b[k]}
    if lost:
        print("WARNING: hvdsync's workers did not get these SyncConfig knobs (asked, got): "
              + ", ".join(f"{k} ({a!r}, {g!r})" for k, (a, g) in lost.items()))
    if baseline:
        print("\nmedian time / torch.distributed median, per size:")
        for v in chosen:
            if v.name != baseline:
                print(f"  {v.label:<38} " + "  ".join(f"{s} MB: {summary[v.name][s]['ratio']:.2f}"
                                                      for s in summary[v.name]))
    if args.json:
        doc = {"command": " ".join([Path(sys.argv[0]).name] + (argv if argv is not None else sys.argv[1:])),
               "machine": info, "op": args.op, "sizes_mb": sizes, "iters": args.iters, "rounds": args.rounds,
               "warmup": args.warmup, "baseline": baseline, "sync_overrides": sync,
               "variants": {v.name: {"label": v.label, "spec": results[v.name]["variant"],
                                     "knobs": results[v.name]["knobs"], "seen": results[v.name]["seen"],
                                     "sizes": summary[v.name], "rounds_s": results[v.name]["rounds"]}
                            for v in chosen},
               "knobs_lost_by_launcher": {k: list(x) for k, x in lost.items()}}
        Path(args.json).write_text(json.dumps(doc, indent=1))
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(suite.run(__file__, {"allreduce": suite.Part(main, suite.first_line(__doc__))}, doc=__doc__))
