"""Horovod's knobs and what its runtime costs besides the collective: the knob sweep, the idle loop, the launch.

    python benchmarks/knobs.py                    # the sweep: single, multi, step; 15 timed iterations per size in 3
                                                  # rounds (~35 min)
    python benchmarks/knobs.py --part single      # one tensor per allreduce: cycle time, cache, wait, copies
    python benchmarks/knobs.py --part multi       # 256 tensors per step (like a model's gradients): fusion, cycle
    python benchmarks/knobs.py --part step        # matmuls then 64 allreduces, timed as a whole: cycle, wait
    python benchmarks/knobs.py --part timeline    # Horovod's own timeline: negotiation, Gloo ring, copies
    python benchmarks/knobs.py --part dtype       # float16 against float32, the same elements (fp16 compression)
    python benchmarks/knobs.py --json knobs.json  # every figure as JSON
    python benchmarks/knobs.py idle-loop          # Horovod's background loop while nothing is reduced (patch 0007)
    python benchmarks/knobs.py launch             # what starting a job costs the launching process
    python benchmarks/knobs.py --record quiet idle-loop   # keep it: results/knobs/<date>-idle-loop-quiet.{txt,json}

The suite's parts: ``sweep`` (the default, below; its own ``--part`` picks among its sweeps), ``idle-loop``
(:mod:`hvdlab.bench.idle_loop`) and ``launch`` (:mod:`hvdlab.bench.launch_overhead`); ``python benchmarks/knobs.py
PART --help`` gives a part's options.

The sweep: each configuration is its own pair of workers started by :func:`hvdsync.launch.local.run` (the knobs set
in the worker just before ``hvd.init()``, so the launcher cannot drop them); torch.distributed runs in its own
processes; all of them alternate round by round, in an order rotated every round. Besides time, each row shows:

* ``cpu ms``: CPU time both processes spent per allreduce (all threads). A waiting thread that spins, or a
  background loop that never sleeps, shows here: CPU the training's own compute does not get on a 2-core machine.
* ``idle %``: CPU both processes burn in one idle second after ``init`` (100 % = one core), i.e. what the
  configuration costs between allreduces, while the model computes.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from hvdlab.bench import harness, idle_loop, launch_overhead, report, suite

MB = harness.MB
# Unset: Horovod's built-in defaults (1 ms cycle, cache 1024) even under an unpatched horovod.runner.run.
DEFAULTS = {"HOROVOD_CYCLE_TIME": None, "HOROVOD_CACHE_CAPACITY": None}
# What an unpatched horovod.runner.run (0.28.1) handed every worker: HOROVOD_CYCLE_TIME=(None,) and
# HOROVOD_CACHE_CAPACITY=(None,), which Horovod's strtof/strtol read as 0: no cycle sleep, no response cache.
UNPATCHED_RUNNER = {"HOROVOD_CYCLE_TIME": "0", "HOROVOD_CACHE_CAPACITY": "0"}
RUNNER_LABEL = "cycle 0, cache 0 (unpatched runner.run)"
# Upstream's background loop (harness.UPSTREAM_LOOP), which negotiates an empty cycle every cycle time while nothing
# is outstanding.
UPSTREAM_LOOP_LABEL = "cycle 1 ms, upstream idle loop (no 0007)"


def _v(name, label, env=None, **kw) -> harness.Variant:
    return harness.Variant(name, label, init="hvdsync", worker_env={**DEFAULTS, **(env or {})}, **kw)


def single() -> list[harness.Variant]:
    """One tensor per allreduce, in place unless said (what hvd.DistributedOptimizer does per gradient)."""
    cyc = [_v(f"cycle{c:g}", f"cycle {c:g} ms, cache 1024", {"HOROVOD_CYCLE_TIME": f"{c:g}"}, call="allreduce_")
           for c in (0.1, 0.5, 2, 5)]
    return [
        _v("runner", RUNNER_LABEL, UNPATCHED_RUNNER, call="allreduce_"),
        _v("default", "Horovod defaults: cycle 1 ms, cache 1024", call="allreduce_"),
        _v("outofplace", "defaults, hvd.allreduce (out of place)", call="allreduce"),
        *cyc,
        _v("nocache", "cycle 1 ms, cache 0", {"HOROVOD_CACHE_CAPACITY": "0"}, call="allreduce_"),
        _v("busyloop", UPSTREAM_LOOP_LABEL, harness.UPSTREAM_LOOP, call="allreduce_"),
        _v("sleepwait", "defaults, poll + sleep 50 us wait", call="allreduce_", wait="sleep"),
        _v("affinity", "defaults, HOROVOD_THREAD_AFFINITY=0,1", {"HOROVOD_THREAD_AFFINITY": "0,1"},
           call="allreduce_"),
        harness.Variant("torch", "torch.distributed (one all_reduce)", backend="torch"),
        harness.Variant("torch_threads", "torch.distributed, torch's default threads", backend="torch",
                        threads=None),
    ]


def multi(pieces: int) -> list[harness.Variant]:
    """``pieces`` in-place allreduce_async_ calls per step, then wait for all (DistributedOptimizer's pattern)."""
    fus = [_v(f"fusion{f:g}", f"fusion {f:g} MiB, cycle 1 ms", {"HOROVOD_FUSION_THRESHOLD": str(int(f * MB))},
              call="split_", pieces=pieces) for f in (64, 16, 4, 0)]
    cyc = [_v(f"m_cycle{c:g}", f"fusion 128 MiB, cycle {c:g} ms", {"HOROVOD_CYCLE_TIME": f"{c:g}"},
              call="split_", pieces=pieces) for c in (0.1, 5)]
    return [
        _v("m_runner", RUNNER_LABEL, UNPATCHED_RUNNER, call="split_", pieces=pieces),
        _v("m_default", "Horovod defaults: fusion 128 MiB, cycle 1 ms", call="split_", pieces=pieces),
        *fus,
        *cyc,
        _v("grouped", "defaults, one grouped_allreduce_", call="grouped_", pieces=pieces),
        harness.Variant("torch", "torch.distributed (one all_reduce)", backend="torch"),
    ]


def step(pieces: int, compute: int) -> list[harness.Variant]:
    """A training-like step: ``compute`` matmuls, then ``pieces`` in-place allreduces; the step is what is timed."""
    kw = dict(call="split_", pieces=pieces, compute=compute)
    cyc = [_v(f"s_cycle{c:g}", f"cycle {c:g} ms, cache 1024", {"HOROVOD_CYCLE_TIME": f"{c:g}"}, **kw)
           for c in (1, 2, 5)]
    return [
        _v("s_runner", RUNNER_LABEL, UNPATCHED_RUNNER, **kw),
        *cyc,
        _v("s_sleepwait", "cycle 1 ms, poll + sleep 50 us wait", wait="sleep", **kw),
        _v("s_busyloop", UPSTREAM_LOOP_LABEL, harness.UPSTREAM_LOOP, **kw),
        harness.Variant("torch", "torch.distributed (one all_reduce)", backend="torch", compute=compute),
    ]


def timeline(folder: str) -> list[harness.Variant]:
    """Horovod's own account of where an allreduce's time goes (``HOROVOD_TIMELINE``), spinning and sleeping wait."""
    def tl(name):
        return {"HOROVOD_TIMELINE": str(Path(folder) / f"{name}.json")}

    return [
        _v("t_spin", "defaults, timeline on", tl("t_spin"), call="allreduce_"),
        _v("t_sleep", "defaults, poll + sleep wait, timeline on", tl("t_sleep"), call="allreduce_", wait="sleep"),
        harness.Variant("torch", "torch.distributed (one all_reduce)", backend="torch"),
    ]


def dtypes() -> list[harness.Variant]:
    """The same number of elements as float32 and as float16 (what fp16 compression hands Horovod), Horovod and
    torch.distributed: half the bytes, but each side must add float16 numbers on the CPU."""
    return [
        _v("d_fp32", "hvdsync, float32, in place", call="allreduce_"),
        _v("d_fp16", "hvdsync, float16, in place", call="allreduce_", dtype="float16"),
        harness.Variant("torch", "torch.distributed, float32", backend="torch"),
        harness.Variant("torch_fp16", "torch.distributed, float16", backend="torch", dtype="float16"),
    ]


def timeline_report(variants, warmup: int) -> str:
    """Median ms per activity and size, from the last round's timeline of each Horovod variant."""
    lines = ["Horovod timeline (rank 0, last round, warm-up dropped), median ms:"]
    for v in variants:
        path = v.worker_env.get("HOROVOD_TIMELINE")
        if not path:
            continue
        for size, ops in report.timeline_ops(path).items():
            ops = ops[warmup:]
            med = {k: statistics.median(o.get(k, 0.0) for o in ops)
                   for k in ("NEGOTIATE_ALLREDUCE", "ALLREDUCE", "GLOO_ALLREDUCE")}
            lines.append(f"  {v.label:<44} {size:.3g} MiB: negotiate {med['NEGOTIATE_ALLREDUCE']:.2f}, "
                         f"execute {med['ALLREDUCE']:.2f} = gloo ring {med['GLOO_ALLREDUCE']:.2f} + copy and scale "
                         f"{statistics.median(o['ALLREDUCE'] - o.get('GLOO_ALLREDUCE', 0.0) for o in ops):.2f}"
                         f"  ({len(ops)} ops)")
    return "\n".join(lines) + "\n"


def part_report(title: str, variants, results, summary) -> str:
    lines = [title, report.format_table(summary, {v.name: v.label for v in variants}),
             "idle CPU after init (both processes, 100 % = one core), median over rounds:"]
    for v in variants:
        idle = results[v.name]["idle_cpu"]
        if idle:
            lines.append(f"  {v.label:<48} {100 * statistics.median(idle):6.1f} %   "
                         f"(rounds: {', '.join(f'{100 * x:.0f}' for x in idle)})")
    return "\n".join(lines) + "\n"


# The parts: configurations, default sizes (MiB), title.
PARTS = {
    "single": (lambda a, tmp: single(), "0.004,1,16,64", "one tensor per allreduce"),
    "multi": (lambda a, tmp: multi(a.pieces), "1,64", "{pieces} tensors per step (size = their total)"),
    "step": (lambda a, tmp: step(64, a.compute), "1,16",
             "{compute} matmuls, then 64 tensors (size = their total); the whole step is timed"),
    "timeline": (lambda a, tmp: timeline(tmp), "16,64", "one tensor per allreduce, HOROVOD_TIMELINE on"),
    "dtype": (lambda a, tmp: dtypes(), "4,16,64", "float16 vs float32, the same elements (size = as float32)"),
}


def run_part(part: str, args, tmp: str) -> dict:
    make, default_sizes, title = PARTS[part]
    variants = make(args, tmp)
    if args.only:
        keep = set(args.only.split(",")) | {"torch"}
        variants = [v for v in variants if v.name in keep]
    sizes = report.parse_sizes(args.sizes or ("0.004,0.25" if args.quick else default_sizes))
    print(f"\n[{part}] {len(variants)} configurations, sizes {sizes} MiB", flush=True)
    results = harness.run_rounds(variants, sizes, args.iters, args.rounds, args.warmup, args.op, idle_s=args.idle,
                                 log=lambda s: print(s, flush=True))
    summary = report.summarize(results, "torch")
    report.check_finite(summary)
    print(part_report(f"\n== {part}: {title.format(**vars(args))} ==", variants, results, summary), flush=True)
    if part == "timeline":
        print(timeline_report(variants, args.warmup), flush=True)
    return {"sizes_mb": sizes, "variants": {v.name: {"label": v.label, "spec": results[v.name]["variant"],
                                                     "knobs": results[v.name]["knobs"], "seen": results[v.name]["seen"],
                                                     "idle_cpu": results[v.name]["idle_cpu"], "sizes": summary[v.name],
                                                     "rounds_s": results[v.name]["rounds"]} for v in variants}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="knobs.py sweep", description="Sweep Horovod's knobs on 2 local Gloo workers, "
                                "against torch.distributed measured in the same run.", epilog=suite.RECORD_HELP)
    p.add_argument("--part", choices=(*PARTS, "all"), default="all",
                   help="which sweep (default all: single, multi, step; timeline only when asked)")
    p.add_argument("--sizes", default="", help="MiB, comma-separated (default: single 0.004,1,16,64; multi 1,64; "
                                               "step 1,16; timeline 16,64)")
    p.add_argument("--pieces", type=int, default=256, help="tensors per step in the multi part (default 256)")
    p.add_argument("--compute", type=int, default=10, help="256x256 matmuls per step in the step part (default 10)")
    p.add_argument("--iters", type=int, default=15, help="timed iterations per size and configuration (default 15)")
    p.add_argument("--rounds", type=int, default=3, help="rounds the iterations are spread over (default 3)")
    p.add_argument("--warmup", type=int, default=2, help="untimed iterations per size at each start (default 2)")
    p.add_argument("--idle", type=float, default=1.0, help="seconds of idle CPU measurement per start (default 1)")
    p.add_argument("--op", choices=("average", "sum"), default="average")
    p.add_argument("--only", default="", help="comma-separated configuration names to run (plus torch)")
    p.add_argument("--quick", action="store_true", help="tiny sizes, 1 round of 2 iterations")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    if args.quick:
        args.iters, args.rounds, args.warmup, args.idle = 2, 1, 1, 0.2
    if args.iters < 1 or args.rounds < 1 or args.warmup < 0:
        p.error("--iters and --rounds must be >= 1, --warmup >= 0")
    args.iters = -(-args.iters // args.rounds) * args.rounds  # the same number in every round
    try:
        report.parse_sizes(args.sizes or "1")
    except ValueError as exc:
        p.error(str(exc))
    parts = ("single", "multi", "step") if args.part == "all" else (args.part,)
    info = report.machine()
    print(f"Horovod knob sweep, allreduce {args.op}, float32, 2 local processes; {args.iters} timed iterations per "
          f"size in {args.rounds} round(s); {info['cpus']} CPUs, load average {info['load']}", flush=True)
    doc = {"command": " ".join(["knobs.py"] + (argv if argv is not None else sys.argv[1:])), "machine": info,
           "op": args.op, "parts": {}}
    with tempfile.TemporaryDirectory(prefix="hvdsync-knobs-") as tmp:  # timelines
        for part in parts:
            doc["parts"][part] = run_part(part, args, tmp)
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1))
        print(f"wrote {args.json}")
    return 0


SUITE_PARTS = {"sweep": suite.Part(main, "Horovod's knobs swept on 2 local Gloo workers, torch.distributed in the "
                                        "same run"),
               "idle-loop": suite.Part(idle_loop.main, suite.first_line(idle_loop.__doc__)),
               "launch": suite.Part(launch_overhead.main, suite.first_line(launch_overhead.__doc__))}

if __name__ == "__main__":
    sys.exit(suite.run(__file__, SUITE_PARTS, default="sweep", doc=__doc__))
