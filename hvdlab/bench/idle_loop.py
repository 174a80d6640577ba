"""What Horovod's background loop costs a model's compute while nothing is being reduced (patch 0007).

    python benchmarks/knobs.py idle-loop                # 3 rounds of 8 s per contender (~3 min)
    python benchmarks/knobs.py idle-loop --rounds 5 --seconds 10 --json idle.json

Two workers on this machine's cores each train the small CNN of ``benchmarks/training.py`` on their own, with **no**
synchronisation at all, for a fixed time; only what else lives in the process differs:

* ``plain``: plain processes, no Horovod;
* ``horovod``: ``hvd.init()`` with hvdsync's defaults (1 ms cycle) on the installed build: with
  ``scripts/horovod-patches/0007`` its loop waits for work while nothing is outstanding;
* ``upstream``: the same with ``HOROVOD_IDLE_WAIT_MS=0``: upstream's loop, which negotiates an empty cycle with
  the other rank every cycle time.

Per step and worker: the wall time, the CPU time of the computing thread, and their difference, the time that
thread was ready but had no core (or waited): on a host with no spare cores, whatever else runs in the process
shows there. Also the share of a core each process used in all. The slowest worker's median counts; each round
starts every contender once, in an order rotated by the round, so noise hits them alike; ratios are to ``plain``
in the same round.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from hvdlab.bench.harness import UPSTREAM_LOOP

CONTENDERS = {"plain": None, "horovod": {}, "upstream": UPSTREAM_LOOP}


def compute(seconds: float, horovod: bool) -> dict:
    """Train the CNN alone for ``seconds``; per step: wall and this thread's CPU (ms)."""
    import time

    import torch

    torch.set_num_threads(1)
    if horovod:
        import horovod.torch as hvd

        hvd.init()
        hvd.allreduce_(torch.zeros(1), name="idle_loop.start")   # the loop has run, and is idle from here on
    from hvdlab.bench.step_common import Work, data
    from hvdlab.bench.step_torch import model

    work = Work("cnn", hidden=16, image=16, global_batch=128, warmup=0, steps=1)
    x, y = data(work)
    xb, yb = torch.from_numpy(x[:64].copy()), torch.from_numpy(y[:64].copy())
    m = model(work)
    opt = torch.optim.SGD(m.parameters(), lr=0.01)

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(m(xb), yb).backward()
        opt.step()

    for _ in range(20):
        step()
    wall, cpu = [], []
    p0, w0 = time.process_time(), time.perf_counter()
    while time.perf_counter() - w0 < seconds:
        t, c = time.perf_counter(), time.thread_time()
        step()
        wall.append(1e3 * (time.perf_counter() - t))
        cpu.append(1e3 * (time.thread_time() - c))
    share = (time.process_time() - p0) / (time.perf_counter() - w0)
    if horovod:
        hvd.shutdown()
    return {"wall": statistics.median(wall), "cpu": statistics.median(cpu),
            "lost": statistics.median(w - c for w, c in zip(wall, cpu)), "share": share, "steps": len(wall)}


def _run(name: str, seconds: float) -> list[dict]:
    from hvdlab.bench.harness import run_processes

    if CONTENDERS[name] is None:
        with tempfile.TemporaryDirectory(prefix="hvdsync-idle-") as tmp:
            outs = [Path(tmp) / f"{r}.json" for r in range(2)]
            run_processes([[sys.executable, "-m", __name__, "--worker", str(o), "--seconds", str(seconds)]
                           for o in outs], dict(os.environ), 600, "plain")
            return [json.loads(o.read_text()) for o in outs]
    from hvdsync.config import SyncConfig
    from hvdsync.launch.local import run

    return run(compute, args=(seconds, True), np=2, sync=SyncConfig(), progress=False, timeout=600,
               env={"HOROVOD_IDLE_WAIT_MS": "20", **CONTENDERS[name]})


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="knobs.py idle-loop", description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=8.0, help="timed compute per contender start")
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--worker", metavar="OUT", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        Path(args.worker).write_text(json.dumps(compute(args.seconds, False)))
        return 0
    load = os.getloadavg()
    print(f"load average {' '.join(f'{x:.1f}' for x in load)}; {args.rounds} rounds of {args.seconds:g} s "
          "per contender, 2 workers, the small CNN, no synchronisation", flush=True)
    names = list(CONTENDERS)
    rounds = []
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        got = {n: _run(n, args.seconds) for n in order}
        rounds.append({n: {k: max(w[k] for w in got[n]) for k in ("wall", "cpu", "lost", "share")} for n in names})
        print(f"  round {r + 1}: " + ", ".join(f"{n} {rounds[-1][n]['wall']:.1f} ms" for n in names), flush=True)
    med = {n: {k: statistics.median(x[n][k] for x in rounds) for k in ("wall", "cpu", "lost", "share")}
           for n in names}
    per_round = {n: [x[n]["wall"] / x["plain"]["wall"] for x in rounds] for n in names}
    print(f"\n{'contender':10s} {'step ms':>8s} {'thread CPU':>10s} {'lost ms':>8s} {'core share':>10s} "
          f"{'step / plain (per round)':>26s}")
    for n in names:
        m = med[n]
        print(f"{n:10s} {m['wall']:8.2f} {m['cpu']:10.2f} {m['lost']:8.2f} {m['share']:10.3f} "
              f"{statistics.median(per_round[n]):8.3f} ({min(per_round[n]):.2f}-{max(per_round[n]):.2f})")
    print(f"load average at end {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    if args.json:
        Path(args.json).write_text(json.dumps({"load_start": load, "load_end": os.getloadavg(), "rounds": rounds,
                                               "median": med, "step_over_plain": per_round}, indent=1))
    return 0


if __name__ == "__main__":  # the plain workers start here: python -m hvdlab.bench.idle_loop --worker OUT ...
    sys.exit(main())
