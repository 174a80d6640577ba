"""Training across 2 hosts joined by a bandwidth-limited link: every gradient codec at every link rate, in one run.

    sudo python benchmarks/link.py                                   # 100mbit,1gbit,10gbit,none x torch, tensorflow
    sudo python benchmarks/link.py --rates 1gbit,none --frameworks torch --codecs none,fp16,topk:0.01
    sudo python benchmarks/link.py --quick                           # a small model, 2 rates: every path in minutes
    sudo python benchmarks/link.py --record quiet                    # keep it: results/link/<date>-quiet.*

Over loopback (every other suite here) an all-reduce is a memory copy, so a codec that saves bytes saves little
time. Here the job's 2 workers run on 2 test hosts (:mod:`hvdlab.testhosts`: network namespaces with sshd, joined by
a bridge), and each host's outgoing link is limited to the rate under test with ``tc ... tbf`` (the kernel has no
``netem``: a rate, not a delay). Per rate and framework, one job of 2 Horovod workers (one per host, Gloo over the
link, launched over ssh from node1) trains the wide MLP of ``benchmarks/compression.py`` once per codec, from the same
start on the same samples (:func:`hvdsync.launch.train_many`). Per run it prints:

* step time: the mean over epochs after the first of the slowest rank's step, and its ratio to ``none`` at the same
  rate; ``sync %``: the share of a step spent waiting for the reduction;
* bytes over the link per step, from node1's interface counters (all it sent during the run / steps), and their
  ratio to what the codec hands Horovod per step times the ring's factor (2 (n-1)/n = 1 on 2 ranks): near 1 when
  the link carries the gradients and little else;
* the cost model's step time: the step's compute (its non-sync part, measured) plus :func:`hvdlab.costmodel.ring_time`
  of the codec's bytes over a link of that rate (``alpha`` 100 us, ``beta`` = 1/rate); ``pred/meas``;
* test accuracy after the last epoch.

Needs root and Linux network namespaces (``scripts/install_test_hosts.sh`` installs sshd and iproute2).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compression import CODECS, baseline, configs  # noqa: E402 - the same models and codecs as the loopback suite

from hvdlab.bench import suite  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RATES = ["100mbit", "1gbit", "10gbit", "none"]
ALPHA_S = 100e-6  # per-message cost of Gloo over TCP between namespaces: small next to the transfers here


def rate_bits(rate: str) -> float | None:
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
    if rate == "none":
        return None
    for unit, scale in units.items():
        if rate.endswith(unit):
            return float(rate[: -len(unit)]) * scale
    raise ValueError(rate)


def summarise(result: dict, rate: str) -> dict:
    from hvdlab import costmodel

    history = result["history"]
    steady = history[1:] or history
    step = statistics.fmean(h["step_seconds_max_rank"] for h in steady)
    phases = result["phase_seconds"]
    total = sum(phases.values()) or 1.0
    sync_share = phases.get("sync_wait", 0.0) / total
    steps = max(1, result["optimizer_steps"])
    wire = result["wire"]["bytes"] / steps
    link = (result.get("link_bytes") or {}).get("sent", 0) / steps
    bits = rate_bits(rate)
    predicted = None
    if bits:
        # n = 2: the ring sends 2 (n-1)/n = 1 x the buffer each way, in 2 (n-1) = 2 messages.
        predicted = step * (1 - sync_share) + costmodel.ring_time(wire, 2, costmodel.Link(ALPHA_S, 8 / bits))
    return {"rate": rate, "framework": result["config"]["train"]["framework"],
            "compression": result["config"]["sync"]["compression"], "numel": result["numel"], "steps": steps,
            "wire_bytes_per_step": wire, "link_bytes_per_step": link, "link_over_wire": link / wire if wire else None,
            "step_ms": 1e3 * step, "sync_share": sync_share, "predicted_ms": predicted and 1e3 * predicted,
            "accuracy": result["test_accuracy"], "ranks_identical": result["param_spread"] == 0.0}


def table(rows: list[dict]) -> str:
    lines = [f"{'rate':<8} {'framework':<10} {'codec':<11} {'link B/step':>12} {'link/wire':>9} {'step ms':>8} "
             f"{'x none':>7} {'sync %':>7} {'model ms':>9} {'pred/meas':>9} {'accuracy':>9}"]
    for r in rows:
        base = baseline(rows, r, ("rate", "framework"))
        r["time_ratio"] = r["step_ms"] / base["step_ms"]
        predicted = f"{r['predicted_ms']:>9.1f} {r['predicted_ms'] / r['step_ms']:>9.2f}" if r["predicted_ms"] \
            else f"{'-':>9} {'-':>9}"
        lines.append(f"{r['rate']:<8} {r['framework']:<10} {r['compression']:<11} {r['link_bytes_per_step']:>12,.0f} "
                     f"{r['link_over_wire'] or 0:>9.3f} {r['step_ms']:>8.1f} {r['time_ratio']:>7.2f} "
                     f"{100 * r['sync_share']:>7.1f} {predicted} {r['accuracy']:>9.4f}")
    return "\n".join(lines)


def job(argv: list[str]) -> int:
    """Runs on node1: one job of 2 workers (node1, node2) training every config; prints ``RESULT <json>``."""
    from hvdsync import launch
    from hvdsync.config import Config

    spec = json.loads(argv[0])
    results = launch.train_many([Config.from_dict(c) for c in spec["configs"]], hosts=spec["hosts"],
                                ssh_identity_file=spec["key"], network_interfaces=["hv0"])
    print("RESULT " + json.dumps(results), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="link.py", description=__doc__.split("\n")[0], epilog=suite.RECORD_HELP)
    p.add_argument("--rates", default=",".join(RATES), help="comma-separated tc rates (100mbit, 1gbit) or none")
    p.add_argument("--frameworks", default="torch,tensorflow", help="comma-separated: torch, tensorflow")
    p.add_argument("--codecs", default=",".join(CODECS), help="comma-separated sync.compression values")
    p.add_argument("--quick", action="store_true", help="the small MLP, 1 epoch, rates 1gbit and none")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON")
    args = p.parse_args(argv)
    rates = [r.strip() for r in ("1gbit,none" if args.quick and args.rates == ",".join(RATES) else args.rates)
             .split(",") if r.strip()]
    frameworks = [f.strip() for f in args.frameworks.split(",") if f.strip()]
    codecs = [c.strip() for c in args.codecs.split(",") if c.strip()]
    if "none" not in codecs:
        codecs.insert(0, "none")
    bad = [f for f in frameworks if f not in ("torch", "tensorflow")]
    for r in rates:
        try:
            rate_bits(r)
        except ValueError:
            bad.append(r)
    if bad:
        p.error(f"not allowed: {', '.join(bad)}; frameworks: torch, tensorflow; rates: <number>kbit|mbit|gbit or none")

    from hvdlab.testhosts import TestHosts, unavailable

    why = unavailable()
    if why:
        print(f"link.py: {why}", file=sys.stderr)
        return 2
    start, rows = time.perf_counter(), []
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    with TestHosts(2, prefix=f"hvdlink{os.getpid()}", subnet="10.77.3") as cluster:
        for rate in rates:
            cluster.set_rate(None if rate == "none" else rate)
            for framework in frameworks:  # one job per framework: a process imports one of them
                cfgs = [c.to_dict() for c in configs(framework, codecs, args.quick)]  # np = 2
                spec = {"configs": cfgs, "hosts": "node1:1,node2:1", "key": str(cluster.key)}
                out = cluster.run("node1", [sys.executable, __file__, "job", json.dumps(spec)], cwd=ROOT, env=env)
                line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
                if out.returncode != 0 or line is None:
                    print(f"link.py: the job at {rate} ({framework}) failed:\n{out.stderr[-3000:]}", file=sys.stderr)
                    return 1
                rows += [summarise(r, rate) for r in json.loads(line[len("RESULT "):])]
                print(f"{rate} {framework}: done ({time.perf_counter() - start:.0f} s)", file=sys.stderr, flush=True)
    first = rows[0]
    print(f"wide MLP: {first['numel']:,} parameters ({4 * first['numel'] / 1e6:.1f} MB of float32 gradient per step), "
          f"{first['steps']} steps per codec, 2 workers on 2 hosts (1 each), Gloo over a tbf-limited veth link; "
          f"{time.perf_counter() - start:.0f} s in all")
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"quick": args.quick, "rates": rates, "rows": rows}, indent=2))
    return 0


SUITE_PARTS = {"sweep": suite.Part(main, "every codec at every link rate between 2 test hosts: step time, bytes "
                                         "over the link, the cost model's prediction"),
               "job": suite.Part(job, "(internal) the job one sweep point runs on node1")}

if __name__ == "__main__":
    sys.exit(suite.run(__file__, SUITE_PARTS, default="sweep", doc=__doc__))
