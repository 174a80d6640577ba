"""What starting a job costs in the launching process, side by side in one run: Horovod's own build checks vs
hvdsync's (issue: a PyTorch run imported TensorFlow in the launcher).

    python benchmarks/knobs.py launch                 # 3 rounds of both variants, 2 workers each
    python benchmarks/knobs.py launch --rounds 5 --json launch.json

Before it starts workers, ``horovod.runner`` asks "was Horovod built with Gloo? with MPI?". Horovod answers by
forking a process that imports ``horovod.tensorflow`` (its first framework), so a launch of a *PyTorch* job paid a
TensorFlow import, and that child wrote TensorFlow's absl start-up lines into the launcher's terminal.
:func:`hvdsync.launch.local.run` answers the same questions from Horovod's compiled extensions (no import).

Both variants run :func:`hvdsync.launch.local.run` on a worker function that imports nothing, each in a fresh Python
process (Horovod caches its answers per process), alternating in every round:

  (a) Horovod's checks: the launcher with ``_build_checks_from_binaries`` replaced by a no-op;
  (b) hvdsync: the launcher as shipped.

Printed per variant: the median wall time of ``launch.run`` (min-max), the CPU seconds the launching process and its
children used, and how many TensorFlow start-up lines reached its stderr; then the ratio (a)/(b) of the medians.
TensorFlow's oneDNN line is forced on (``TF_ENABLE_ONEDNN_OPTS=1``) so that it shows on any CPU.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

NOISE = re.compile(r"oneDNN|absl::InitializeLog|cpu_feature_guard")


def _rank() -> str:
    return os.environ.get("HOROVOD_RANK", "?")


def one(variant: str) -> None:
    """Child: one launch, timed; prints a JSON line."""
    import contextlib

    from hvdsync import launch
    from hvdsync.launch import runner

    if variant == "horovod":
        # Where launch.run looks the checks up: the runner's module (hvdsync.launch.runner), not those that re-export run.
        runner._build_checks_from_binaries = contextlib.nullcontext
    t = time.perf_counter()
    ranks = launch.run(_rank, np=2, progress=False)
    seconds = time.perf_counter() - t
    assert sorted(ranks) == ["0", "1"], ranks
    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    print(json.dumps({"seconds": seconds, "cpu": sum(u.ru_utime + u.ru_stime for u in usage)}))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="knobs.py launch", description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", metavar="PATH", help="also write every figure as JSON")
    p.add_argument("--one", choices=["horovod", "hvdsync"], help=argparse.SUPPRESS)
    ns = p.parse_args(argv)
    if ns.one:
        one(ns.one)
        return
    env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": "1"}
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    variants = ["horovod", "hvdsync"]
    got = {v: {"seconds": [], "cpu": [], "noise": []} for v in variants}
    for r in range(ns.rounds):
        for v in variants[r % 2:] + variants[:r % 2]:  # alternate the order: noise lands on both alike
            proc = subprocess.run([sys.executable, "-m", __name__, "--one", v], capture_output=True, text=True, env=env,
                                  check=True)
            record = json.loads(proc.stdout.strip().splitlines()[-1])
            got[v]["seconds"].append(record["seconds"])
            got[v]["cpu"].append(record["cpu"])
            got[v]["noise"].append(len(NOISE.findall(proc.stderr)))
    labels = {"horovod": "(a) Horovod's build checks", "hvdsync": "(b) hvdsync (from the binaries)"}
    for v in variants:
        s = got[v]["seconds"]
        print(f"{labels[v]:<34} launch.run {statistics.median(s):6.2f} s ({min(s):.2f}-{max(s):.2f}), "
              f"CPU {statistics.median(got[v]['cpu']):6.2f} s, TensorFlow lines on stderr: {got[v]['noise']}")
    ratio = statistics.median(got["horovod"]["seconds"]) / statistics.median(got["hvdsync"]["seconds"])
    print(f"ratio (a)/(b) of the median wall time: {ratio:.2f}")
    if ns.json:
        Path(ns.json).write_text(json.dumps({"rounds": ns.rounds, "variants": got, "ratio": ratio}, indent=1))


if __name__ == "__main__":  # each launch runs here in a fresh process: python -m hvdlab.bench.launch_overhead --one
    main()
