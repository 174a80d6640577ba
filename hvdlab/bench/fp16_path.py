"""Where an fp16 all-reduce spends its time on CPU workers: the cast, Horovod's float16 reduction, hvdsync's hook.

    python benchmarks/step.py fp16-path            # 2 workers, a 4.2 M-value gradient (the compression MLP's)
    python benchmarks/step.py fp16-path --numel 1000000 --reps 30

``benchmarks/compression.py`` found fp16 *slower* per step than float32 on 2 CPU workers over loopback, though it
moves half the bytes. This splits one gradient's fp16 reduction into its parts, each timed on its own on the same
tensor, interleaved (variant a, b, c, ... then again), median of ``--reps`` (the slowest rank's time):

* ``allreduce float32``: Horovod's all-reduce of the float32 gradient (what ``none`` does);
* ``cast 32->16->32``: encoding and decoding alone (two ``Tensor.to``), no communication;
* ``allreduce float16``: Horovod's all-reduce of an already-cast float16 tensor: the wire and Horovod's float16
  sum, no cast;
* ``... op=Sum``: the same two all-reduces without the average's postscale (Horovod scales the summed buffer by
  1/size after the reduction; a Sum skips that pass), to tell the reduction's cost from the scaling's;
* ``Horovod fp16``: ``hvd.allreduce(x, compression=hvd.Compression.fp16)``, Horovod's own compressor;
* ``hvdsync fp16``: the same through hvdsync's :class:`~hvdsync.torch.compression.CodecCompressor` (what
  ``sync.compression: fp16`` uses), including its wire counter;
* ``allgather float16 + sum``: the half-precision values gathered and summed by torch in float32 (how ``bf16``
  travels), as an alternative to Horovod's float16 sum.

Every variant's result is compared with the float32 sum (to fp16 rounding): a fast-but-wrong variant fails the run.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path


def _worker(numel: int, reps: int) -> dict:
    import horovod.torch as hvd
    import torch

    from hvdsync.torch.compression import CodecCompressor
    from hvdsync.torch.runtime import init

    init()
    rank = hvd.rank()
    x = torch.randn(numel, generator=torch.Generator().manual_seed(rank)) * 0.01
    x16 = x.to(torch.float16)
    hook = CodecCompressor("fp16")

    def gather_sum():
        return hvd.allgather(x16.reshape(1, -1), name="g").to(torch.float32).sum(0) / hvd.size()

    variants = {
        "allreduce float32": lambda: hvd.allreduce(x, name="a"),
        "cast 32->16->32": lambda: x.to(torch.float16).to(torch.float32),
        "allreduce float16": lambda: hvd.allreduce(x16, name="b").to(torch.float32),
        "allreduce float32 op=Sum": lambda: hvd.allreduce(x, name="as", op=hvd.Sum) / hvd.size(),
        "allreduce float16 op=Sum": lambda: hvd.allreduce(x16, name="bs", op=hvd.Sum).to(torch.float32) / hvd.size(),
        "Horovod fp16": lambda: hvd.allreduce(x, name="c", compression=hvd.Compression.fp16),
        "hvdsync fp16": lambda: hvd.allreduce(x, name="d", compression=hook),
        "allgather float16 + sum": gather_sum,
    }
    exact = hvd.allreduce(x, name="exact")
    times = {k: [] for k in variants}
    for _ in range(reps + 1):   # the first round warms up (buffers, Horovod's response cache)
        for name, fn in variants.items():
            hvd.allreduce(torch.zeros(1), name="barrier")
            start = time.perf_counter()
            out = fn()
            times[name].append(time.perf_counter() - start)
            if name != "cast 32->16->32" and not torch.allclose(out, exact, rtol=2e-3, atol=2e-5):
                raise AssertionError(f"{name}: wrong result")
    # The slowest rank's time per repetition: a collective is done when both are.
    both = {k: hvd.allgather(torch.tensor([v[1:]], dtype=torch.float64), name=f"t.{k}").max(0).values.tolist()
            for k, v in times.items()}
    return {k: 1e3 * statistics.median(v) for k, v in both.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="step.py fp16-path", description=__doc__.split("\n")[0])
    p.add_argument("--numel", type=int, default=4_239_370, help="values in the gradient (default: the MLP's)")
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--json", metavar="PATH", help="also write the medians (ms) as JSON")
    args = p.parse_args(argv)
    from hvdsync import launch

    ms = launch.run(_worker, args=(args.numel, args.reps), np=2, progress=False)[0]
    base = ms["allreduce float32"]
    print(f"one gradient of {args.numel:,} float32 values ({4 * args.numel / 1e6:.1f} MB), 2 workers (Gloo, "
          f"loopback), median of {args.reps}, slowest rank")
    print(f"{'variant':<26} {'ms':>8} {'x float32 allreduce':>20}")
    for name, t in ms.items():
        print(f"{name:<26} {t:>8.1f} {t / base:>20.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"numel": args.numel, "reps": args.reps, "median_ms": ms}, indent=1))
    return 0
