"""Where a small model's step goes, Horovod against DDP: the same 2 processes, the contenders interleaved step by step.

    python benchmarks/step.py latency                    # the CNN of training.py, 60 steps per contender (~2 min)
    python benchmarks/step.py latency --steps 100 --cycle-ms 1,5 --json latency.json

Every worker holds Horovod *and* a ``torch.distributed`` Gloo group, and one copy of the model per contender; each
step runs every contender once, in an order that alternates, after a barrier:

* ``local``: forward, backward, update, no synchronisation (the compute alone);
* ``hooks``: ``hvd.DistributedOptimizer`` (one hook per gradient tensor hands it to Horovod during backward);
* ``grouped``: hvdsync's default for small models (:class:`hvdsync.torch.grouped.GroupedOptimizer`): one grouped
  all-reduce after backward, waited for by poll + sleep;
* ``grouped_spin``: the same call waited for by ``hvd.synchronize`` (Horovod 0.28.1 spins there; with hvdsync's
  patch 0005 it waits on a condition variable);
* ``fit_step``: ``hvdsync.torch.fit``'s own step (``TorchBackend.train_step``: ``grouped`` with the phase timer,
  the loss scaled for the global batch); its fwd+bwd and sync are the timer's compute and sync-wait phases;
* ``ddp``: ``DistributedDataParallel`` (its one bucket is all-reduced from the autograd engine, inside backward).

Per contender, the slowest rank's median of: the step; forward + backward (DDP's includes its all-reduce); from the
later rank's last gradient (its hook, inside backward) to the later rank holding the reduced gradients ("sync": the
latency a step pays once both ranks' compute is done; DDP's is inside its backward); the update.
Then Horovod's rounds per step, counted in a short second pass with Horovod's timeline on (one round = one Gloo
all-reduce, which fuses what was ready in that cycle). A second job of plain processes (no Horovod) runs ``local``
and ``ddp`` again: what Horovod's background loop (it wakes every ``HOROVOD_CYCLE_TIME`` and negotiates with the
other rank even when nothing is queued) costs the compute of a process that has it.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

VARIANTS = ("local", "hooks", "grouped", "grouped_spin", "fit_step", "ddp")
PHASES = ("step", "fwdbwd", "sync", "update")


def _setup(variants, rank, port, horovod: bool):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from hvdlab.bench.step_common import Work, data
    from hvdlab.bench.step_torch import model

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    work = Work("cnn", hidden=16, image=16, global_batch=128, warmup=0, steps=1)
    x, y = data(work)
    half = slice(rank * 64, (rank + 1) * 64)
    batch = torch.from_numpy(x[half].copy()), torch.from_numpy(y[half].copy())
    models = {}
    for v in variants:
        m = model(work)
        opt = torch.optim.SGD(m.parameters(), lr=work.lr)
        if v == "hooks":
            import horovod.torch as hvd

            opt = hvd.DistributedOptimizer(opt, named_parameters=m.named_parameters())
        elif v.startswith("grouped"):
            from hvdsync.config import SyncConfig
            from hvdsync.torch.compression import CodecCompressor
            from hvdsync.torch.grouped import GroupedOptimizer

            opt = GroupedOptimizer(opt, m.named_parameters(), SyncConfig(), CodecCompressor("none"))
        elif v == "fit_step":
            from hvdsync.config import SyncConfig
            from hvdsync.torch.train import TorchBackend

            opt = TorchBackend(m, opt, SyncConfig())  # wraps the SGD as fit does (grouped for this small model)
        last = [0.0]
        for p in m.parameters():
            p.register_post_accumulate_grad_hook(lambda _p, last=last: last.__setitem__(0, time.perf_counter()))
        models[v] = (DistributedDataParallel(m) if v == "ddp" else m, opt, last)
    return batch, models


def _step(v, net, opt, last, batch):
    import torch.nn.functional as F

    t0 = time.perf_counter()
    if v == "fit_step":
        from hvdsync.core.train._scaling import loss_scale

        before = opt.timer.snapshot()
        opt.train_step([batch], loss_scale(2 * len(batch[1]), 2, "average"))
        t3 = time.perf_counter()
        _, compute, sync, update = (b - a for a, b in zip(before, opt.timer.snapshot()))
        return {"step": t3 - t0, "fwdbwd": compute, "update": update, "last_grad": last[0],
                "reduced": t0 + compute + sync}
    opt.zero_grad()
    F.cross_entropy(net(batch[0]), batch[1]).backward()
    t1 = time.perf_counter()
    if v == "grouped_spin":
        import horovod.torch as hvd

        # GroupedOptimizer's call, waited for the way hvd.synchronize waits.
        grads = [p.grad for p in opt.parameters]
        hvd.synchronize(hvd.grouped_allreduce_async_(grads, name="hvdsync.grouped", op=hvd.Average))
        opt._reduced = True
    elif v in ("hooks", "grouped"):
        opt.synchronize()
    t2 = time.perf_counter()
    if v in ("hooks", "grouped", "grouped_spin"):
        with opt.skip_synchronize():
            opt.step()
    else:
        opt.step()
    t3 = time.perf_counter()
    # Durations, and two stamps for "sync" (perf_counter is the system's monotonic clock, the same in both
    # processes): when this rank's last gradient was ready (its hook, inside backward) and when it held the reduced
    # gradients.
    return {"step": t3 - t0, "fwdbwd": t1 - t0, "update": t3 - t2, "last_grad": last[0], "reduced": t2}


def _loop(variants, batch, models, steps, warmup):
    import torch.distributed as dist

    times = {v: {k: [] for k in (*PHASES, "last_grad", "reduced")} for v in variants}
    for i in range(warmup + steps):
        for v in (variants if i % 2 == 0 else variants[::-1]):
            dist.barrier()
            net, opt, last = models[v]
            t = _step(v, net, opt, last, batch)
            if i >= warmup:
                for k in (*PHASES[:2], PHASES[3], "last_grad", "reduced"):
                    times[v][k].append(t[k])
    return times


def horovod_worker(variants, steps, warmup, port, timeline_steps, timeline_path):
    import horovod.torch as hvd
    import torch
    import torch.distributed as dist

    hvd.init()
    rank = hvd.rank()
    batch, models = _setup(variants, rank, port, horovod=True)
    times = _loop(variants, batch, models, steps, warmup)
    # The same steps on the same samples: every synchronising contender ends with the same parameters.
    params = {v: float(sum(p.detach().double().sum() for p in models[v][0].parameters())) for v in variants}
    # Rounds: a short pass per Horovod contender with the timeline on (it costs CPU, so not while timing).
    windows = {}
    for v in (v for v in variants if v in ("hooks", "grouped", "grouped_spin")):
        hvd.start_timeline(f"{timeline_path}.{v}", mark_cycles=False)
        hvd.allreduce(torch.zeros(1), name=f"mark.{v}")
        t0 = time.time()
        for _ in range(timeline_steps):
            dist.barrier()
            _step(v, *models[v], batch)
        windows[v] = (t0, time.time())
        hvd.stop_timeline()
    dist.destroy_process_group()
    return {"times": times, "windows": windows, "params": params}


def plain_main(args) -> None:
    """A plain worker (no Horovod): ``local`` and ``ddp``; writes its times as JSON."""
    import torch.distributed as dist

    variants = args.variants.split(",")
    batch, models = _setup(variants, args.rank, args.port, horovod=False)
    times = _loop(variants, batch, models, args.steps, args.warmup)
    dist.destroy_process_group()
    Path(args.out).write_text(json.dumps({"times": times}))


def rounds(path: str, steps: int) -> float:
    """Gloo all-reduces (fused rounds) per step in a timeline written over ``steps`` steps."""
    from hvdsync.core.telemetry import timeline

    starts = sorted(a.start for s in timeline.read(path).select("ALLREDUCE") if not s.name.startswith("mark")
                    for a in s.activities if a.name.startswith("GLOO"))
    # The tensors of one fused round get their activity stamped one after the other, microseconds apart.
    return sum(1 for i, t in enumerate(starts) if i == 0 or t - starts[i - 1] > 2e-4) / steps


def _slowest(per_rank: list[dict], v: str, k: str) -> float:
    """The median over steps of the slowest rank's ``k``; for ``sync``: from the moment the *later* rank had its
    last gradient to the moment the later rank held the reduced ones (the latency after all compute is done,
    without the wait for the other rank's backward)."""
    a, b = per_rank[0]["times"][v], per_rank[1]["times"][v]
    if k == "sync":
        return statistics.median(max(r0, r1) - max(g0, g1) for g0, g1, r0, r1 in
                                 zip(a["last_grad"], b["last_grad"], a["reduced"], b["reduced"]))
    return statistics.median(max(x, y) for x, y in zip(a[k], b[k]))


def main(argv=None) -> int:
    from hvdlab.bench.harness import _free_port, run_processes

    p = argparse.ArgumentParser(prog="step.py latency", description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--cycle-ms", default="1", help="comma-separated HOROVOD_CYCLE_TIME values, one job each")
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--plain-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--out", default="", help=argparse.SUPPRESS)
    p.add_argument("--variants", default="local,ddp", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.plain_worker:
        plain_main(args)
        return 0

    from hvdsync.config import SyncConfig
    from hvdsync.launch.local import run

    doc = {"load_start": os.getloadavg(), "steps": args.steps, "jobs": {}}
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}; {args.steps} steps per contender",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="hvdsync-latency-") as tmp:
        for cycle in [float(c) for c in args.cycle_ms.split(",")]:
            tl = str(Path(tmp) / f"tl{cycle}")
            res = run(horovod_worker, args=(list(VARIANTS), args.steps, args.warmup, _free_port(), 10, tl), np=2,
                      sync=SyncConfig(cycle_time_ms=cycle), env={"HOROVOD_TIMELINE": "DYNAMIC"},
                      progress=False)
            job = {v: {k: 1e3 * _slowest(res, v, k) for k in PHASES} for v in VARIANTS}
            for v in ("hooks", "grouped", "grouped_spin"):
                job[v]["rounds_per_step"] = rounds(f"{tl}.{v}", 10)
            job["params_equal"] = len({round(r["params"][v], 9) for r in res for v in VARIANTS if v != "local"}) == 1
            doc["jobs"][f"horovod, cycle {cycle:g} ms"] = job
        port, outs = _free_port(), [Path(tmp) / f"plain{r}.json" for r in range(2)]
        cmds = [[sys.executable, "-m", __name__, "--plain-worker", "--rank", str(r), "--port", str(port), "--out",
                 str(outs[r]), "--steps", str(args.steps), "--warmup", str(args.warmup)] for r in range(2)]
        run_processes(cmds, {**os.environ, "GLOO_SOCKET_IFNAME": "lo"}, 900, "plain")
        res = [json.loads(o.read_text()) for o in outs]
        doc["jobs"]["plain processes (no Horovod)"] = {v: {k: 1e3 * _slowest(res, v, k) for k in PHASES}
                                                       for v in ("local", "ddp")}
    doc["load_end"] = os.getloadavg()
    _print(doc)
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1))
    return 0


def _print(doc: dict) -> None:
    for name, job in doc["jobs"].items():
        print(f"\n{name}" + ("" if job.get("params_equal", True) else "  (PARAMETERS DIFFER)"))
        ddp = job["ddp"]["step"]
        print(f"  {'contender':14s} {'step ms':>8s} {'fwd+bwd':>8s} {'sync':>8s} {'update':>8s} {'/ ddp':>6s} "
              f"{'rounds/step':>11s}")
        for v, row in job.items():
            if not isinstance(row, dict):
                continue
            r = row.get("rounds_per_step")
            print(f"  {v:14s} {row['step']:8.2f} {row['fwdbwd']:8.2f} {row['sync']:8.2f} {row['update']:8.2f} "
                  f"{row['step'] / ddp:6.2f} {'' if r is None else f'{r:11.1f}'}")
    print(f"\nload average at end {' '.join(f'{x:.1f}' for x in doc['load_end'])}")


if __name__ == "__main__":  # the plain workers start here: python -m hvdlab.bench.step_latency --plain-worker ...
    sys.exit(main())
