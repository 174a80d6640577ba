"""Training step time on 2 local workers, side by side in one run: hvdsync vs raw Horovod vs DDP / tf.distribute.

    python benchmarks/training.py                          # both frameworks, the MLP and the CNN (~30-60 min here)
    python benchmarks/training.py --framework torch --model mlp --reps 3
    python benchmarks/training.py --json t.json --md t.md  # also write every figure (JSON) and the tables (markdown)
    python benchmarks/training.py --quick                  # tiny models, 1 repetition: every path in ~2-3 minutes
    python benchmarks/training.py --record quiet           # keep it: benchmarks/results/training/<date>-quiet.*
    make bench                                             # allreduce.py, compression.py, then this (recorded)

Three questions, one table each, from one run:

1. **Step time**: the same model, data, global batch, SGD and steps for every contender
   (:mod:`hvdlab.bench.step_common`), after warm-up: hvdsync (``fit``, and the plain adapter API) vs a hand-written
   raw Horovod loop vs ``DistributedDataParallel`` (torch) / ``MultiWorkerMirroredStrategy`` (TensorFlow) vs one
   process on the whole global batch. Each contender's final parameters are compared with the one-process run's
   after the same steps: a contender that does not match is printed WRONG, gets no ratio, and the run exits with
   status 3.
2. **Scaling**: one process with 1 and with 2 threads against 2 workers of 1 thread (the machine has 2 cores), the
   efficiency, and what :mod:`hvdlab.costmodel` predicts from this machine's measured loopback and memory.
3. **Knobs against their off state** (MLP only, where communication dominates): fp16 on the wire, accumulation
   k=4, fusion off, a 5 ms cycle, ``HOROVOD_AUTOTUNE``, each against hvdsync's defaults in the same run.

Every contender's processes get the same allocator settings (:func:`hvdlab.bench.link_fair.same_allocator`: what
hvdsync's ``train.keep_freed_memory`` sets, in the environment, for the raw loop, DDP and MWMS as well).

Noise: each repetition starts every contender once (fresh processes), in an order rotated by the repetition number,
so machine noise lands on all alike; ratios are of medians over all timed steps, with the range of the same ratio
taken inside each repetition. A step's time is the slowest rank's.
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from hvdlab.bench import link_fair, report, suite
from hvdlab.bench.harness import UPSTREAM_LOOP
from hvdlab.bench.step_common import WRONG_ENV, Spec, Work, works

# Parameters after the same steps, relative to how far the 1-process run moved them: float rounding of a
# different summation order stays far below this; a skipped or doubled all-reduce is of order 1.
TOLERANCE = 1e-3
TOLERANCE_FP16 = 3e-2  # gradients rounded to fp16 on the wire (relative error ~5e-4 per element)


@dataclass
class Contender:
    """A row: ``spec`` is what the workers run; ``group``: ``step``, ``scaling`` or ``knobs``; ``versus``: the row
    its knob is compared with."""

    label: str
    spec: Spec
    group: str = "step"
    versus: str = ""
    env: dict | None = None
    tolerance: float = TOLERANCE


def contenders(framework: str, work: Work, knobs: bool) -> list[Contender]:
    w = work.__dict__

    def c(name, label, kind, group="step", sync=None, threads=1, world=2, **kw):
        return Contender(label, Spec(name, framework, kind, w, sync, threads, world), group, **kw)

    peer = ("ddp", "torch DDP (gloo)") if framework == "torch" else ("mwms", "tf MultiWorkerMirroredStrategy")
    out = [c("single", "1 process, 1 thread, global batch", "single", world=1),
           c("fit", "hvdsync fit", "fit", sync={}),
           c("api", "hvdsync adapter API", "api", sync={}),
           c("raw", "raw Horovod" + (" DistributedOptimizer" if framework == "torch" else " grouped_allreduce"),
             "raw"),
           c(peer[0], peer[1], peer[0]),
           c("single_2t", "1 process, 2 threads, global batch", "single", group="scaling", threads=2, world=1)]
    if knobs and framework == "torch" and work.model == "cnn":
        # A small model's gradients go in one grouped call after backward (sync.grouped_mb); these rows are the
        # per-tensor hooks it replaced, in the same run (TensorFlow always reduces in one grouped call).
        out += [c("api_hooks", "adapter API, per-tensor hooks", "api", "knobs", {"grouped_mb": 0}, versus="api"),
                c("fit_hooks", "fit, per-tensor hooks", "fit", "knobs", {"grouped_mb": 0}, versus="fit")]
    if knobs and work.model == "cnn":
        # Horovod's background loop as upstream has it (scripts/horovod-patches/0007 off): an empty negotiation
        # with the other rank every cycle while the model computes, on cores the compute needs.
        out.append(c("fit_busyloop", "fit, upstream idle loop (no 0007)", "fit", "knobs", {}, versus="fit",
                     env=UPSTREAM_LOOP))
    if knobs and work.model == "mlp":
        out += [c("fp16", "fp16 on the wire", "api", "knobs", {"compression": "fp16"}, versus="api",
                  tolerance=TOLERANCE_FP16),
                c("accumulate4", "accumulate k=4", "api", "knobs", {"accumulate": 4}, versus="api")]
        if framework == "torch":  # Horovod's knobs act alike in both frameworks' workers: measured once
            out += [c("fusion0", "fusion off (0 MB)", "api", "knobs", {"fusion_threshold_mb": 0}, versus="api"),
                    c("cycle5", "cycle 5 ms", "api", "knobs", {"cycle_time_ms": 5}, versus="api"),
                    c("autotune", "HOROVOD_AUTOTUNE=1", "api", "knobs", {}, versus="api",
                      env={"HOROVOD_AUTOTUNE": "1"})]
    return out


# ---- running one contender ---------------------------------------------------------------------------------------
def _module(framework: str):
    import importlib

    return importlib.import_module("hvdlab.bench.step_torch" if framework == "torch" else "hvdlab.bench.step_tf")


def run_horovod(con: Contender, env: dict) -> list[dict]:
    from hvdsync.config import SyncConfig
    from hvdsync.launch.local import run

    mod = _module(con.spec.framework)
    sync = SyncConfig(**con.spec.sync) if con.spec.sync is not None else None
    with tempfile.TemporaryDirectory(prefix="hvdsync-bench-") as logs:
        return run(mod.horovod_worker, args=(con.spec.to_dict(),), np=con.spec.world, sync=sync,
                   env={**(con.env or {}), **env}, progress=False, log_dir=logs)


def run_plain(con: Contender, env: dict, timeout: float = 1800) -> list[dict]:
    from hvdlab.bench.harness import _free_port, run_processes

    port = _free_port()
    if con.spec.kind == "mwms":  # TF_CONFIG needs one address per worker: two consecutive ports, the second checked
        while not _port_free(port + 1):
            port = _free_port()
    with tempfile.TemporaryDirectory(prefix="hvdsync-bench-") as tmp:
        child_env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "TF_CPP_MIN_LOG_LEVEL": "2", **(con.env or {}), **env}
        outs = [Path(tmp) / f"rank{rank}.pkl" for rank in range(con.spec.world)]
        jobs = [json.dumps({"spec": con.spec.to_dict(), "rank": rank, "world": con.spec.world, "port": port})
                for rank in range(con.spec.world)]
        run_processes([[sys.executable, __file__, "worker", job, str(out)] for job, out in zip(jobs, outs)],
                      child_env, timeout, con.spec.name)
        return [pickle.loads(o.read_bytes()) for o in outs]


def _port_free(port: int) -> bool:
    import socket

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def run_one(con: Contender, env: dict) -> list[dict]:
    return (run_horovod if con.spec.kind in ("raw", "api", "fit") else run_plain)(con, env)


# ---- repetitions, correctness, summary -------------------------------------------------------------------------------
def measure(cons: list[Contender], reps: int, env: dict, log=print) -> dict:
    """Every contender once per repetition, in an order rotated by the repetition; per contender the slowest
    rank's time of every timed step, per repetition, and the workers' figures from the last repetition."""
    out = {c.spec.name: {"reps": [], "ranks": None} for c in cons}
    for r in range(reps):
        for con in cons[r % len(cons):] + cons[:r % len(cons)]:
            t0 = time.perf_counter()
            try:
                ranks = run_one(con, env)
            except Exception as exc:  # a contender that cannot run here is reported, not fatal for the others
                out[con.spec.name]["error"] = str(exc)[-2000:]
                log(f"  rep {r + 1}/{reps}: {con.spec.name} FAILED ({str(exc).splitlines()[0][:200]})")
                continue
            out[con.spec.name]["reps"].append([max(step) for step in zip(*(rk["times"] for rk in ranks))])
            out[con.spec.name]["ranks"] = ranks
            log(f"  rep {r + 1}/{reps}: {con.spec.name} ({time.perf_counter() - t0:.0f} s)")
    return out


def _distance(a, b):
    import numpy as np

    return float(np.linalg.norm(np.asarray(a) - np.asarray(b)))


def check(cons: list[Contender], measured: dict) -> dict:
    """Per contender: its parameters' distance from the 1-process run's, relative to how far that run moved them
    (on the sampled positions), whether both ranks agree, and the verdict against the contender's tolerance."""
    ref = measured["single"]["ranks"][0]
    moved = _distance(ref["fingerprint"]["sample"], ref["start"]["sample"])
    verdicts = {}
    for con in cons:
        ranks = measured[con.spec.name]["ranks"]
        if not ranks:
            verdicts[con.spec.name] = {"checked": False, "correct": False, "why": "did not run"}
            continue
        fp = [rk["fingerprint"] for rk in ranks]
        rel = _distance(fp[0]["sample"], ref["fingerprint"]["sample"]) / max(moved, 1e-30)
        spread = max(_distance(f["sample"], fp[0]["sample"]) for f in fp) / max(moved, 1e-30)
        ok = rel <= con.tolerance and spread <= con.tolerance and fp[0]["numel"] == ref["fingerprint"]["numel"]
        verdicts[con.spec.name] = {"checked": True, "correct": bool(ok), "relative_error": rel,
                                   "rank_spread": spread, "tolerance": con.tolerance}
    return verdicts


def summarize(cons: list[Contender], measured: dict, verdicts: dict, global_batch: int) -> dict:
    rows = {}
    for con in cons:
        m = measured[con.spec.name]
        if not m["reps"]:
            rows[con.spec.name] = {"label": con.label, "error": m.get("error", "no repetition ran"),
                                   **verdicts[con.spec.name]}
            continue
        ts = [t for rep in m["reps"] for t in rep]
        med = statistics.median(ts)
        rk0 = m["ranks"][0]
        rows[con.spec.name] = {
            "label": con.label, "group": con.group, "versus": con.versus, "n": len(ts), "median_ms": med * 1e3,
            "p10_ms": report.percentile(ts, 10) * 1e3, "p90_ms": report.percentile(ts, 90) * 1e3,
            "samples_per_s": global_batch / med, "threads": rk0.get("threads"), "knobs": rk0.get("knobs"),
            "bytes_per_step": rk0.get("bytes_per_step"),
            "allreduce_rounds_per_step": rk0.get("allreduce_rounds_per_step"),
            "backward_passes_per_step": (con.spec.sync or {}).get("accumulate", 1), **verdicts[con.spec.name]}
    return rows


def ratio(rows: dict, measured: dict, name: str, base: str) -> dict | None:
    """``name``'s median over ``base``'s, and the same ratio inside each repetition (min-max); None when either
    did not run or is wrong (a wrong contender gets no ratio)."""
    a, b = rows.get(name, {}), rows.get(base, {})
    if "median_ms" not in a or "median_ms" not in b or not a["correct"] or not b["correct"]:
        return None
    per = [statistics.median(x) / statistics.median(y) for x, y in zip(measured[name]["reps"], measured[base]["reps"])]
    return {"ratio": a["median_ms"] / b["median_ms"], "per_rep": [min(per), max(per)]}


def cost_model(block: dict, link) -> dict:
    """Speedups over one process with 1 thread, and the cost model's 2-worker step: half the 1-thread step (the
    compute splits) plus a ring all-reduce of the gradients on this machine's measured link."""
    from hvdlab import costmodel

    rows = block["rows"]
    base = rows.get("single", {}).get("median_ms")
    speedup = {n: base / rows[n]["median_ms"] for n in ("single", "single_2t", "api")
               if base and "median_ms" in rows.get(n, {})}
    out = {"speedup": speedup, "model_mb": block["numel"] * 4 / 1e6}
    if base and link is not None:
        ring = costmodel.predict("ring", block["numel"] * 4, 2, link) * 1e3
        out.update(predicted_ms=base / 2 + ring, ring_ms=ring, predicted_speedup=base / (base / 2 + ring))
    return out


def measure_link(quick: bool):
    """This machine's loopback and memory figures as a cost-model link (:mod:`hvdlab.hardware`)."""
    from hvdlab import costmodel, hardware

    nbytes = (4 if quick else 64) * 2**20
    lo, mem = hardware.loopback(nbytes=nbytes, pings=50, repeats=3), hardware.memory_bandwidth(nbytes, repeats=3)
    return costmodel.Link(alpha=lo["latency_s"], beta=1 / lo["bandwidth_bytes_per_s"], gamma=mem["gamma"],
                          name="loopback, measured")


def main(argv: list[str] | None = None) -> int:
    from hvdlab.bench import train_tables

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=suite.RECORD_HELP)
    p.add_argument("--framework", choices=("torch", "tensorflow", "all"), default="all")
    p.add_argument("--model", choices=("mlp", "cnn", "all"), default="all")
    p.add_argument("--reps", type=int, default=2, help="repetitions, each starting every contender once")
    p.add_argument("--steps", type=int, help="timed steps per start (default: 5 MLP, 8 CNN)")
    p.add_argument("--only", default="", help="comma-separated contender names (single always runs)")
    p.add_argument("--no-knobs", action="store_true", help="leave out the knob rows")
    p.add_argument("--quick", action="store_true", help="tiny models, 1 repetition: exercises every path")
    p.add_argument("--json", metavar="PATH", help="write every figure as JSON")
    p.add_argument("--md", metavar="PATH", help="write the tables as markdown")
    p.add_argument("--wrong", metavar="NAME", default="",
                   help="self-test: contender NAME (raw, ddp) skips its gradient all-reduce; it must come out WRONG")
    args = p.parse_args(argv)
    if args.reps < 1 or (args.steps is not None and args.steps < 1):
        p.error("--reps and --steps must be >= 1")
    if args.wrong not in ("", "raw", "ddp"):
        p.error(f"--wrong: {args.wrong!r} is not allowed; choose raw or ddp (the contenders with a skip switch)")
    reps = 1 if args.quick else args.reps
    frameworks = ["torch", "tensorflow"] if args.framework == "all" else [args.framework]
    models = ["mlp", "cnn"] if args.model == "all" else [args.model]
    env = {**link_fair.same_allocator(), **({WRONG_ENV: args.wrong} if args.wrong else {})}
    info = report.machine()
    print(f"training step time, 2 local workers (Gloo over loopback), {reps} repetition(s); {info['cpus']} CPUs, "
          f"load average {info['load']}", flush=True)
    link = measure_link(args.quick)
    blocks = {}
    for framework in frameworks:
        for model in models:
            work = works(args.quick)[model]
            work = replace(work, steps=args.steps) if args.steps else work
            cons = contenders(framework, work, knobs=not args.no_knobs)
            if args.only:
                keep = {"single", *args.only.split(",")}
                cons = [c for c in cons if c.spec.name in keep]
            print(f"{framework} {model}:", flush=True)
            measured = measure(cons, reps, env, log=lambda s: print(s, flush=True))
            if not measured["single"]["reps"]:
                print(f"the 1-process reference failed:\n{measured['single'].get('error')}", file=sys.stderr)
                return 1
            verdicts = check(cons, measured)
            rows = summarize(cons, measured, verdicts, work.global_batch)
            peer = train_tables.PEERS[framework]
            pairs = [(n, b) for n in rows for b in ("raw", peer, "api", "fit") if n != b]
            block = {"framework": framework, "model": model, "work": work.__dict__, "rows": rows,
                     "numel": measured["single"]["ranks"][0]["fingerprint"]["numel"],
                     "ratios": {f"{n}/{b}": r for n, b in pairs if (r := ratio(rows, measured, n, b))},
                     "step_seconds": {n: m["reps"] for n, m in measured.items()}}
            block["scaling"] = cost_model(block, link)
            block["targets"] = train_tables.targets(block)
            blocks[f"{framework} {model}"] = block
    doc = {"command": " ".join(["benchmarks/training.py"] + (argv if argv is not None else sys.argv[1:])),
           "machine": info, "load_at_end": report.machine()["load"], "reps": reps, "wrong": args.wrong,
           "link": {"alpha_s": link.alpha, "beta_s_per_byte": link.beta, "gamma_s_per_byte": link.gamma},
           "blocks": blocks}
    text, md = train_tables.render(doc)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1, default=str))
        print(f"wrote {args.json}")
    if args.md:
        Path(args.md).write_text(md + "\n")
        print(f"wrote {args.md}")
    wrong = [f"{k}: {n}" for k, b in blocks.items() for n, r in b["rows"].items() if r.get("checked") and
             not r["correct"]]
    if wrong:
        print("WRONG parameters after the same steps as 1 process (no ratio given): " + ", ".join(wrong),
              file=sys.stderr)
        return 3
    return 0


def _worker(job: str, out: str) -> None:
    """A plain (non-Horovod) worker process: ``single``, ``ddp``, ``mwms``."""
    spec = json.loads(job)
    result = _module(spec["spec"]["framework"]).plain_worker(spec["spec"], spec["rank"], spec["world"], spec["port"])
    Path(out).write_bytes(pickle.dumps(result))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "worker":
        _worker(sys.argv[2], sys.argv[3])
    else:
        sys.exit(suite.run(__file__, {"training": suite.Part(main, suite.first_line(__doc__), ("json", "md"))},
                           doc=__doc__))
