"""What makes benchmarks/gpu.py's figures mean something: the facts of the run, and the checks that a contender really
all-reduced and took the right steps.

- :func:`facts`: driver, CUDA (torch's build and the driver's), NCCL's runtime version, Horovod's build key.
- :func:`param_check`: a few float32 steps of every contender from one start with deterministic kernels, each
  contender's parameters against plain torch's, relative to how far torch's moved; and the same figure for a
  gradient off by one rank (halved: the average of one rank's gradient over two), so the record shows the check
  would see that bug.
- :func:`allreduce_proof`: Horovod's own timeline over two untimed steps of each Horovod contender: one all-reduce
  span per gradient per step, each carrying the transport's activity (``NCCL_ALLREDUCE`` on a GPU).
- :func:`ddp_proof`: DDP's buckets all-reduced in each step (a counting communication hook on a separate copy; the
  timed DDP keeps its built-in hook).
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import torch

# A contender whose parameters after PARAM_STEPS float32 steps differ from torch's by more than this fraction of
# torch's own movement is wrong. Deterministic kernels make a correct contender agree to rounding (about 1e-6 of
# it); a reduction off by one rank differs by about half of it (param_check measures that too).
PARAM_TOLERANCE = 1e-3
PARAM_STEPS = 3


def facts(device: torch.device) -> dict:
    """Driver, CUDA and NCCL versions and Horovod's build key: what a reader needs to trust or repeat the record."""
    out: dict = {"torch": torch.__version__, "torch_cuda": torch.version.cuda}
    if device.type == "cuda":
        out["device"] = torch.cuda.get_device_name()
        out["compute_capability"] = ".".join(map(str, torch.cuda.get_device_capability()))
        out["visible_gpus"] = torch.cuda.device_count()
        nccl = torch.cuda.nccl.version()
        out["nccl_runtime"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
        try:
            smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=30)
            out["driver"] = smi.stdout.split("\n")[0].strip() or None
        except (OSError, subprocess.TimeoutExpired):
            out["driver"] = None
        from hvdsync.core.train.gpus import driver_cuda

        out["driver_cuda"] = driver_cuda()
    # scripts/build_horovod.sh writes the installed build's key beside the environment.
    try:
        with open(os.path.join(sys.prefix, "hvdsync-horovod-build-key")) as f:
            out["horovod_build_key"] = f.read().strip()
    except OSError:
        out["horovod_build_key"] = None
    return out


def param_check(start, data, device, names, build, steps: int = PARAM_STEPS) -> dict:
    """Each contender's parameters after ``steps`` float32 steps from ``start`` against plain torch's.

    ``build(name, start, device)`` returns ``(model, step)`` as the timed runs use them, but without autocast.
    Returns per contender ``relative_diff`` (max |p - p_torch| / max |p_torch - p_start|) and ``correct``, and
    ``off_by_one_rank``: the same figure for plain torch with its gradients halved."""
    deterministic = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    try:
        finals = {}
        for name in names:
            model, step = build(name, start, device)
            for _ in range(steps):
                step()
            finals[name] = [p.detach().double().cpu() for p in model.parameters()]
        model, step = build("torch", start, device, grad_scale=0.5)
        for _ in range(steps):
            step()
        halved = [p.detach().double().cpu() for p in model.parameters()]
    finally:
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = deterministic
    first = [start[k].detach().double().cpu() for k, _ in model.named_parameters()]
    moved = max(float((p - q).abs().max()) for p, q in zip(finals["torch"], first))

    def rel(ps):
        return max(float((p - q).abs().max()) for p, q in zip(ps, finals["torch"])) / moved

    rows = {name: {"relative_diff": rel(finals[name]), "correct": rel(finals[name]) < PARAM_TOLERANCE}
            for name in names}
    return {"steps": steps, "tolerance": PARAM_TOLERANCE, "torch_moved": moved, "contenders": rows,
            "off_by_one_rank": rel(halved)}


def allreduce_proof(start, data, device, names, build, steps: int = 2) -> dict:
    """Each Horovod contender's all-reduces in ``steps`` untimed steps, from Horovod's timeline (its core writes a
    span per collective it ran, with the transport's activity inside): every gradient in every step, over the
    transport this device must use (NCCL on a GPU, Gloo on a CPU)."""
    import horovod.torch as hvd

    from hvdsync.core.telemetry import timeline

    # On a CPU the ops go over Gloo, or over MPI where Horovod has MPI and was started without `horovodrun --gloo`
    # (a 1-rank run then takes MPI's controller): either is the CPU's own transport, as NCCL is the GPU's.
    want = "NCCL_ALLREDUCE" if device.type == "cuda" else "MPI_ALLREDUCE" if hvd.mpi_enabled() else "GLOO_ALLREDUCE"
    rows = {}
    with tempfile.TemporaryDirectory() as folder:
        for name in names:
            if name not in ("horovod", "hvdsync"):
                continue
            model, step = build(name, start, device)
            step()  # outside the timeline: the first step's negotiations and buffers
            if device.type == "cuda":
                torch.cuda.synchronize()
            path = os.path.join(folder, f"{name}.json")
            hvd.start_timeline(path)
            for _ in range(steps):
                step()
            if device.type == "cuda":
                torch.cuda.synchronize()
            hvd.stop_timeline()
            spans = timeline.read(path).select("ALLREDUCE")
            gradients = sum(1 for p in model.parameters() if p.requires_grad)
            over = sum(1 for s in spans if any(a.name == want for a in s.activities))
            rows[name] = {"gradients": gradients, "steps": steps, "allreduces": len(spans), "over_" + want: over,
                          "transport": sorted({a.name for s in spans for a in s.activities
                                               if a.name.endswith("_ALLREDUCE")}),
                          "every_gradient_every_step": len(spans) == over == steps * gradients}
            print(f"  {name:8s} {len(spans)} all-reduces in {steps} steps of {gradients} gradients, {over} over "
                  f"{want} ({', '.join(rows[name]['transport']) or 'no transport'})", flush=True)
    return rows


def ddp_proof(start, data, device, build, steps: int = 2) -> dict:
    """DDP's all-reduces in ``steps`` steps of a copy with a counting communication hook (the built-in all-reduce,
    counted): at world size 1 DDP still hands each bucket to the process group, as at N."""
    import torch.distributed as dist

    calls = []

    def counting(state, bucket):
        calls.append(bucket.buffer().numel())
        fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
        return fut.then(lambda f: f.value()[0].div_(dist.get_world_size()))

    model, step = build("ddp", start, device, comm_hook=counting)
    for _ in range(steps):
        step()
    gradients = sum(p.numel() for p in model.parameters() if p.requires_grad)
    row = {"steps": steps, "bucket_allreduces": len(calls), "elements": sum(calls), "gradient_elements": gradients,
           "every_gradient_every_step": len(calls) >= steps and sum(calls) == steps * gradients,
           "backend": dist.get_backend()}
    print(f"  ddp      {len(calls)} bucket all-reduces in {steps} steps, {sum(calls)} of {steps * gradients} "
          f"gradient elements ({row['backend']})", flush=True)
    return row
