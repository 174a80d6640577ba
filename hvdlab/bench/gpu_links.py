"""The cost model's figures on a GPU machine: PCIe host<->device, HBM device<->device, and (with 2+ GPUs) NCCL.

    python benchmarks/gpu.py links              # needs torch with CUDA; prints GB/s and writes nothing
    python benchmarks/gpu.py links --json gpu.json

Per figure: 20 timed copies of 256 MiB after a warm-up, timed with CUDA events, median. Host buffers are pinned
(page-locked), which is what DMA over PCIe needs to reach full speed. With two or more GPUs it also all-reduces
through ``torch.distributed`` with NCCL (one process per GPU) from 1 to 256 MiB and fits the alpha-beta model
(:func:`hvdlab.costmodel.fit_link`). On a machine without CUDA it says so and exits 0.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

MiB = 2**20


def _timed(fn, repeats: int = 20) -> float:
    import torch

    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def copies(nbytes: int = 256 * MiB) -> dict:
    import torch

    n = nbytes // 4
    host = torch.empty(n, dtype=torch.float32, pin_memory=True)
    dev, dev2 = torch.empty(n, device="cuda"), torch.empty(n, device="cuda")
    return {
        "device": torch.cuda.get_device_name(0), "gpus": torch.cuda.device_count(),
        "h2d_bytes_per_s": nbytes / _timed(lambda: dev.copy_(host, non_blocking=True)),
        "d2h_bytes_per_s": nbytes / _timed(lambda: host.copy_(dev, non_blocking=True)),
        # a device copy reads and writes nbytes: the HBM traffic is twice the buffer
        "d2d_bytes_per_s": nbytes / _timed(lambda: dev2.copy_(dev)),
        "add_bytes_per_s": nbytes / _timed(lambda: dev2.add_(dev)),
    }


def _nccl_worker(rank: int, world: int, port: int, sizes: list[int], queue) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    out = {}
    for nbytes in sizes:
        x = torch.ones(nbytes // 4, device="cuda")
        out[nbytes] = _timed(lambda x=x: dist.all_reduce(x), repeats=10)
    if rank == 0:
        queue.put(out)
    dist.destroy_process_group()


def nccl_allreduce(sizes: list[int]) -> dict:
    import socket

    import torch
    import torch.multiprocessing as mp

    world = torch.cuda.device_count()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(_nccl_worker, args=(world, port, sizes, queue), nprocs=world, start_method="spawn")
    return {"world": world, "seconds": queue.get()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="gpu.py links", description=__doc__.split("\n")[0])
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("no torch here: nothing to measure")
        return
    if not torch.cuda.is_available():
        print("no CUDA device here: nothing to measure")
        return
    doc = {"copies": copies()}
    c = doc["copies"]
    print(f"{c['gpus']} x {c['device']}: PCIe host->device {c['h2d_bytes_per_s'] / 1e9:.1f} GB/s, device->host "
          f"{c['d2h_bytes_per_s'] / 1e9:.1f} GB/s (pinned, 256 MiB); device copy {c['d2d_bytes_per_s'] / 1e9:.0f} GB/s "
          f"of buffer ({2 * c['d2d_bytes_per_s'] / 1e9:.0f} GB/s of HBM traffic); "
          f"add {c['add_bytes_per_s'] / 1e9:.0f} GB/s")
    if c["gpus"] >= 2:
        from hvdlab import costmodel  # here: hvdsync needs its own dependencies, a bare GPU box may lack them

        sizes = [s * MiB for s in (1, 4, 16, 64, 256)]
        doc["nccl"] = nccl_allreduce(sizes)
        secs = [doc["nccl"]["seconds"][s] for s in sizes]
        link = costmodel.fit_link(sizes, secs, c["gpus"])
        ratios = costmodel.prediction_ratios(link, sizes, secs, c["gpus"])
        print(f"NCCL all-reduce on {c['gpus']} GPUs: "
              + ", ".join(f"{s // MiB} MiB {t * 1e3:.2f} ms" for s, t in zip(sizes, secs)))
        print(f"fit: alpha {link.alpha * 1e6:.1f} us, bandwidth {link.bandwidth / 1e9:.0f} GB/s; model/measured "
              + ", ".join(f"{r:.2f}" for r in ratios))
    else:
        print("one GPU: no NCCL all-reduce to time (NCCL needs one GPU per rank)")
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1, default=str))
