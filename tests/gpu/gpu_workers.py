"""Runs inside Horovod workers on GPUs (sent by value): tests/gpu/test_gpu.py asserts on what they return.

Each worker starts through ``hvdsync.torch.init`` (one GPU per rank) and returns numbers and facts, not verdicts.
The CPU suite's workers are reused where they fit; the test registers their modules to be sent by value too.
"""
import contextlib
import os
import shutil
import tempfile

from tests.parallel.codecs_workers import overflow_checks
from tests.parallel.torch_workers import _sequential_reference


@contextlib.contextmanager
def nccl_spans(found: dict, transport: str = "NCCL_"):
    """Horovod's timeline around the block (the job's workers start with HOROVOD_TIMELINE=DYNAMIC): fills ``found``
    with what NCCL ran, as rank 0 (the timeline's writer) saw it: ``ops`` (collective -> spans with an ``NCCL_``
    activity) and ``activities`` (their names). Proof that a test's GPU work crossed NCCL, which a 1-rank job need
    not do: hvdsync's grouped call returns at once at one rank, and Horovod's optimizer skips its hooks there."""
    import horovod.torch as hvd

    from hvdsync.core.telemetry import timeline

    folder = tempfile.mkdtemp(prefix="hvdsync-gpu-timeline-")
    path = os.path.join(folder, "timeline.json")
    hvd.start_timeline(path)
    try:
        yield found
    finally:
        hvd.stop_timeline()
        if hvd.rank() == 0:
            spans = [s for s in timeline.read(path).spans if any(a.name.startswith(transport) for a in s.activities)]
            ops: dict = {}
            for s in spans:
                ops[s.op] = ops.get(s.op, 0) + 1
            found.update(ops=ops, activities=sorted({a.name for s in spans for a in s.activities
                                                     if a.name.startswith(transport)}))
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def hooks_at_one_rank():
    """While an optimizer is built: Horovod's gradient hooks on even at one rank (horovod/torch/optimizer.py registers
    them only where ``size() > 1 or HOROVOD_ELASTIC == "1"``; benchmarks/gpu.py does the same), so that a 1-rank test
    all-reduces its gradients over NCCL as N ranks do."""
    old = os.environ.get("HOROVOD_ELASTIC")
    os.environ["HOROVOD_ELASTIC"] = "1"
    try:
        yield
    finally:
        if old is None:
            del os.environ["HOROVOD_ELASTIC"]
        else:
            os.environ["HOROVOD_ELASTIC"] = old


def collectives() -> dict:
    """NCCL all-reduce (sum, average, in place, float16), grouped all-reduce, allgather and broadcast of CUDA tensors;
    each result's largest difference from the arithmetic, and the device it came back on."""
    import horovod.torch as hvd
    import torch

    from hvdsync.torch import init
    from hvdsync.torch.runtime import device

    init()
    dev, rank, size = device(), hvd.rank(), hvd.size()
    # Whole numbers below 1024: their sums over 2 ranks are exact in float16 too, so every check can be exact.
    base = torch.arange(1000, dtype=torch.float32)
    x = (base + rank).to(dev)
    total = size * base + sum(range(size))
    out = {"device": str(dev), "size": size, "nccl_built": bool(hvd.nccl_built()), "nccl": {}}
    with nccl_spans(out["nccl"]):
        _collectives(hvd, torch, dev, rank, size, x, total, out)
    return out


def _collectives(hvd, torch, dev, rank, size, x, total, out) -> None:
    def err(got, want):
        return float((got.float().cpu() - want).abs().max())

    summed = hvd.allreduce(x, op=hvd.Sum, name="gpu.sum")
    out["sum"] = err(summed, total)
    out["average"] = err(hvd.allreduce(x, op=hvd.Average, name="gpu.average"), total / size)
    y = x.clone()
    hvd.allreduce_(y, op=hvd.Sum, name="gpu.in_place")
    out["in_place"] = err(y, total)
    out["float16"] = err(hvd.allreduce(x.half(), op=hvd.Sum, name="gpu.float16"), total)
    grouped = hvd.grouped_allreduce([x, 2 * x[:17], x[:5].half()], op=hvd.Sum, name="gpu.grouped")
    out["grouped"] = max(err(grouped[0], total), err(grouped[1], 2 * total[:17]), err(grouped[2], total[:5]))
    # Allgather of unequal parts: rank r sends r + 1 rows of r.
    gathered = hvd.allgather(torch.full((rank + 1, 3), float(rank), device=dev), name="gpu.allgather")
    out["allgather"] = err(gathered, torch.cat([torch.full((r + 1, 3), float(r)) for r in range(size)]))
    b = torch.full((5,), float(rank), device=dev)
    hvd.broadcast_(b, root_rank=size - 1, name="gpu.broadcast")
    out["broadcast"] = err(b, torch.full((5,), float(size - 1)))
    out["result_devices"] = sorted({summed.device.type, y.device.type, gathered.device.type, b.device.type,
                                    grouped[0].device.type})


def timeline(steps: int = 5) -> dict:
    """All-reduces of a CUDA tensor with HOROVOD_TIMELINE set by the test; Horovod writes the file on shutdown."""
    import horovod.torch as hvd
    import torch

    from hvdsync.torch import init
    from hvdsync.torch.runtime import device

    init()
    x = torch.ones(1 << 20, device=device())
    for i in range(steps):
        hvd.allreduce(x, name=f"gpu.timeline.{i}")
    hvd.shutdown()
    return {"device": str(x.device)}


def placement() -> dict:
    """Where ``init`` put this rank: the device, and the GPU's UUID (which two ranks must never share)."""
    import horovod.torch as hvd
    import torch

    from hvdsync.torch import init
    from hvdsync.torch.runtime import device

    init()
    dev = device()
    uuid = str(torch.cuda.get_device_properties(dev).uuid) if dev.type == "cuda" else None
    return {"rank": hvd.rank(), "local_rank": hvd.local_rank(), "device": str(dev), "uuid": uuid}


def adapter_matches_plain_torch(n_steps: int = 12, batch: int = 32, hidden: int = 32, lr: float = 0.2,
                                seed: int = 3) -> dict:
    """hvdsync's TorchBackend on this rank's GPU for ``n_steps`` steps against plain sequential SGD on the CPU with the
    global batch (tests/parallel/torch_workers.py's reference): the largest parameter difference."""
    import horovod.torch as hvd
    import numpy as np
    import torch

    from hvdsync import datasets
    from hvdsync.config import Config
    from hvdsync.core.train._scaling import loss_scale
    from hvdsync.core.train._plan import ShardPlan
    from hvdsync.torch import TorchBackend, init, mlp

    # grouped_mb=0 and the hooks forced on: every gradient is all-reduced over NCCL in every step at 1 rank too (the
    # grouped call, which this small model would get, returns at once at one rank).
    cfg = Config.from_dict({"train": {"seed": seed}, "sync": {"grouped_mb": 0}, "tracking": {"enabled": False}})
    init(cfg)
    rank, size = hvd.rank(), hvd.size()
    data = datasets.digits(seed=seed)
    x, y = data.x_train, data.y_train
    torch.manual_seed(seed)
    model = mlp(x.shape[1], hidden, 10)
    with hooks_at_one_rank():
        backend = TorchBackend(model, torch.optim.SGD(model.parameters(), lr=lr), cfg.sync)
    plan = ShardPlan(len(x), size, batch, 1, seed=seed)
    nccl: dict = {}
    with nccl_spans(nccl):
        for step in plan.epoch(0, rank)[:n_steps]:
            backend.train_step([(x[m], y[m]) for m in step.micro], loss_scale(step.global_count, size, cfg.sync.op))
    reference = _sequential_reference(x, y, ShardPlan(len(x), 1, size * batch, 1, seed=seed), n_steps, seed, hidden,
                                      lr)
    return {"device": str(backend.device), "nccl": nccl, "steps": n_steps, "gradients": backend.grad_tensors,
            "parameter_devices": sorted({str(p.device) for p in backend.model.parameters()}),
            "max_diff": max(float(np.abs(a - b).max()) for a, b in zip(backend.parameters(), reference))}


def fit_on_gpu(epochs: int = 10) -> dict:
    """``hvdsync.torch.fit`` with the defaults (the MLP on digits): the result and the device it trained on."""
    from hvdsync.config import Config
    from hvdsync.torch import fit, init
    from hvdsync.torch.runtime import device

    cfg = Config.from_dict({"train": {"framework": "torch", "epochs": epochs}, "tracking": {"enabled": False}})
    init(cfg)  # once before the timeline starts (fit's own init then finds Horovod running)
    nccl: dict = {}
    with nccl_spans(nccl):
        result = fit(cfg).to_dict()
    return {"device": str(device()), "nccl": nccl, **{k: result[k] for k in ("test_accuracy", "param_spread", "world_size",
                                                               "optimizer_steps")}}


def overflow_on_gpu() -> dict:
    """tests/parallel/codecs_workers.py's forced fp16 overflow (autocast and the dynamic loss scale), on the GPU."""
    from hvdsync.torch import init
    from hvdsync.torch.runtime import device

    init()
    nccl: dict = {}
    with nccl_spans(nccl):
        rows = overflow_checks("torch")
    return {"device": str(device()), "overflow": rows, "nccl": nccl}


def placement_as_without_nccl() -> dict:
    """:func:`placement` where Horovod reports no NCCL (``hvd.nccl_built``, the one fact a Gloo-only build differs in
    for hvdsync's init): on an NCCL build, the path a GPU node with a Gloo-only Horovod takes."""
    import horovod.torch as hvd

    hvd.nccl_built = lambda: 0
    return placement()


def device_choice(device: str) -> dict:
    """``init`` with ``train.device`` set: where this rank trains, and whether torch opened CUDA at all."""
    import torch

    from hvdsync.config import Config
    from hvdsync.torch import init
    from hvdsync.torch.runtime import device as where

    init(Config.from_dict({"train": {"device": device}}))
    return {"device": str(where()), "cuda_initialized": torch.cuda.is_initialized()}

