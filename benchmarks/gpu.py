"""On a GPU machine: hvdsync's training step against plain torch, DDP and raw Horovod, and the all-reduce over NCCL.

    bash benchmarks/gpu.sh --python PY              # the whole GPU run: build Horovod with NCCL, tests, this, recorded
    python benchmarks/gpu.py --cpu                  # the bench part's self-test on a CPU, in seconds
    horovodrun -np 2 python benchmarks/gpu.py sweep # 2+ GPUs: Horovod's all-reduce against torch.distributed's NCCL
    python benchmarks/gpu.py links --json gpu.json  # PCIe, HBM and (2+ GPUs) NCCL figures for the cost model

Three parts: ``bench`` (the default, below), ``sweep`` (N ranks, one GPU each: Horovod's all-reduce against
``torch.distributed`` over NCCL, the same sizes, interleaved) and ``links`` (:mod:`hvdlab.bench.gpu_links`); ``PART
--help`` gives a part's options. ``bench`` is one GPU, one process, written as JSON (``--json``):

- **Throughput**: a ResNet-style CNN (basic residual blocks, batch norm) on synthetic images already on the GPU, the
  same model start, batch, optimizer and step count for every contender: (a) plain torch, (b) DDP over NCCL at world
  size 1, (c) a raw Horovod loop (``hvd.DistributedOptimizer``), (d) hvdsync's adapter (``hvdsync.torch.init`` +
  ``distributed_optimizer`` + ``broadcast_state``). Repetitions are interleaved (a, b, c, d, a, ...) so clock and
  thermal drift hit each alike; the figure is images per second, median over >= 3 repetitions, and the ratio to
  plain torch. At one rank Horovod would skip the all-reduce (``hvd.DistributedOptimizer`` registers its hooks only
  where ``size() > 1``, and hvdsync's grouped call returns at once), so (c) and (d) would time plain torch: their
  optimizers are built with the hooks forced on (:func:`_hooks_at_one_rank`), and every step all-reduces every
  gradient through Horovod's core, as on N ranks, with no bytes crossing a link. DDP hands its buckets to NCCL at
  world size 1 as at N. The proofs are in the JSON (:mod:`gpu_checks`): Horovod's timeline over two untimed steps
  (an all-reduce per gradient per step, each over ``NCCL_ALLREDUCE`` on a GPU) and DDP's buckets counted.
- **Correctness**: every contender's parameters after 3 float32 steps with deterministic kernels against plain
  torch's, relative to how far torch's moved (tolerance 1e-3; a gradient off by one rank shows as about 0.5, and the
  record holds that figure too).
- **All-reduce sweep**: ``hvd.allreduce`` on float32 GPU tensors of 1-256 MiB, the result checked, median time per
  operation; ``torch.distributed`` NCCL with the same 1 rank as the reference. With one rank no bytes cross a link:
  the figure is the per-operation cost on the GPU path (fusion-buffer copies, the background loop, the NCCL call).

The run fails (exit 1) when Horovod is missing, when it has no NCCL on ``cuda``, when a proof or a check fails or an
all-reduce gives a wrong sum. The record holds the driver, CUDA and NCCL runtime versions and Horovod's build key.

``--cpu`` (= ``--device cpu --quick``) runs every path on a CPU in seconds, the all-reduces over Gloo (the self-test:
tests/unit/test_gpu_bench.py; no figure from it means anything but the proof that the paths ran).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import socket
import statistics
import sys
import time

import torch
from torch import nn

import gpu_checks  # benchmarks/ (this runner's folder) is first on sys.path
from hvdlab.bench import gpu_links, suite


def _args(argv=None):
    p = argparse.ArgumentParser(prog="gpu.py bench", epilog=suite.RECORD_HELP,
                                description="One GPU, one process: hvdsync's training step against plain torch, DDP "
                                            "and raw Horovod, and Horovod's all-reduce on GPU tensors.")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--image", type=int, default=224, help="image side in pixels")
    p.add_argument("--width", type=int, default=64, help="channels of the first stage (ResNet-18: 64)")
    p.add_argument("--steps", type=int, default=40, help="timed steps per repetition")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps per repetition")
    p.add_argument("--reps", type=int, default=5, help="interleaved repetitions (at least 3: the figure is a median)")
    p.add_argument("--sizes", default="1,4,16,64,256", help="all-reduce sizes in MiB")
    p.add_argument("--iters", type=int, default=20, help="timed all-reduces per size")
    p.add_argument("--amp", default="bf16", choices=["bf16", "none"], help="autocast for every contender alike")
    p.add_argument("--quick", action="store_true", help="tiny sizes: every path in seconds (self-test)")
    p.add_argument("--cpu", action="store_true", help="--device cpu --quick: the self-test on a machine without a GPU")
    p.add_argument("--json", default="", help="write the results here")
    a = p.parse_args(argv)
    if a.cpu:
        a.device, a.quick = "cpu", True
    if a.quick:
        a.batch, a.image, a.width, a.steps, a.warmup, a.reps, a.sizes, a.iters = 8, 32, 8, 3, 1, 3, "1", 3
    if a.reps < 3:
        p.error(f"--reps {a.reps}: at least 3 (the figure is the median of the repetitions)")
    return a


# ---- the model: ResNet-18's shape (4 stages of 2 basic blocks), width and image size as arguments ----------------
class Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
            nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout))
        self.skip = (nn.Identity() if stride == 1 and cin == cout else
                     nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)))

    def forward(self, x):
        return torch.relu(self.body(x) + self.skip(x))


def resnet(width: int = 64, classes: int = 1000) -> nn.Module:
    layers: list[nn.Module] = [nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
                               nn.MaxPool2d(3, 2, 1)]
    cin = width
    for stage, mult in enumerate((1, 2, 4, 8)):
        cout = width * mult
        layers += [Block(cin, cout, 1 if stage == 0 else 2), Block(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


# ---- the contenders: each returns (model, optimizer) ready to step ------------------------------------------------
@contextlib.contextmanager
def _hooks_at_one_rank():
    """While a Horovod optimizer is built: its gradient hooks on, even at one rank.

    horovod/torch/optimizer.py registers them only where ``size() > 1 or HOROVOD_ELASTIC == "1"``; without them a
    1-rank job's ``step()`` all-reduces nothing. The variable is read there once, when the optimizer is made, and is
    restored at once (``hvd.init`` has already read the rest of the environment)."""
    old = os.environ.get("HOROVOD_ELASTIC")
    os.environ["HOROVOD_ELASTIC"] = "1"
    try:
        yield
    finally:
        if old is None:
            del os.environ["HOROVOD_ELASTIC"]
        else:
            os.environ["HOROVOD_ELASTIC"] = old


def _plain(model):
    return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def _raw_horovod(model):
    import horovod.torch as hvd

    with _hooks_at_one_rank():
        opt = hvd.DistributedOptimizer(_plain(model), named_parameters=list(model.named_parameters()))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    return opt


def _hvdsync(model):
    from hvdsync.config import SyncConfig
    from hvdsync.torch import broadcast_state, distributed_optimizer

    # grouped_mb=0: the per-tensor hooks, which ResNet-18's 45 MB of gradients get by default anyway (over the 25 MB
    # of sync.grouped_mb); the grouped call a smaller model would get returns at once at one rank.
    with _hooks_at_one_rank():
        opt = distributed_optimizer(_plain(model), model, SyncConfig(grouped_mb=0.0))
    broadcast_state(model, opt)
    return opt


CONTENDERS = {"torch": _plain, "ddp": _plain, "horovod": _raw_horovod, "hvdsync": _hvdsync}


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def _ddp(model, device, comm_hook=None):
    """DDP over the process group (:func:`_process_group`): NCCL on a GPU, Gloo on a CPU."""
    from torch.nn.parallel import DistributedDataParallel

    ddp = DistributedDataParallel(model, device_ids=[device.index or 0] if device.type == "cuda" else None)
    if comm_hook is not None:
        ddp.register_comm_hook(None, comm_hook)
    return ddp


def _builder(a, data):
    """``build(name, start, device, ...)`` -> (model, step): one contender's model from the common start and its
    training step on the common batch; ``grad_scale`` scales the gradients before the step (param_check's
    off-by-one-rank figure), ``amp`` False for float32, ``comm_hook`` for DDP's proof."""
    x, y = data

    def build(name, start, device, grad_scale=1.0, amp=True, comm_hook=None):
        model = resnet(a.width).to(device)
        model.load_state_dict(start)
        opt = CONTENDERS[name](model)
        forward = _ddp(model, device, comm_hook) if name == "ddp" else model
        loss_fn = nn.CrossEntropyLoss()
        autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp and a.amp == "bf16")

        def step():
            opt.zero_grad()  # Horovod 0.28.1 takes no set_to_none (torch: None by default)
            with autocast:
                loss = loss_fn(forward(x), y)
            loss.backward()
            if grad_scale != 1.0:
                for p in model.parameters():
                    p.grad.mul_(grad_scale)
            opt.step()

        return model, step

    return build


def _train(a, build, name, device, start):
    """One repetition of one contender from the common start; (images per second, final parameters)."""
    model, step = build(name, start, device)
    for _ in range(a.warmup):
        step()
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    _sync(device)
    seconds = time.perf_counter() - t0
    return a.batch * a.steps / seconds, [p.detach().float().clone() for p in model.parameters()]


def _start(a, device):
    """The common start: the model's parameters and one batch of synthetic images on ``device``."""
    torch.manual_seed(0)
    start = {k: v.clone() for k, v in resnet(a.width).state_dict().items()}
    g = torch.Generator().manual_seed(1)
    x = torch.randn(a.batch, 3, a.image, a.image, generator=g).to(device)
    y = torch.randint(0, 1000, (a.batch,), generator=g).to(device)
    return start, (x, y)


def throughput(a, build, device, start, names):
    rates: dict[str, list[float]] = {n: [] for n in names}
    diffs: dict[str, float] = {}
    for rep in range(a.reps):
        finals = {}
        for name in names:  # interleaved: a, b, c, d, a, b, c, d, ...
            rate, finals[name] = _train(a, build, name, device, start)
            rates[name].append(rate)
            print(f"  rep {rep}: {name:8s} {rate:9.1f} img/s", flush=True)
        for name in names:
            diffs[name] = max(diffs.get(name, 0.0), max(float((p - q).abs().max()) for p, q in
                                                        zip(finals[name], finals["torch"])))
    base = statistics.median(rates["torch"])
    rows = {}
    for name in names:
        med = statistics.median(rates[name])
        # After the timed bf16 steps with cuDNN's fastest (non-deterministic) kernels the parameters drift apart by
        # rounding: shown, not judged; gpu_checks.param_check judges correctness.
        rows[name] = {"images_per_s": rates[name], "median": med, "min": min(rates[name]), "max": max(rates[name]),
                      "ratio_to_torch": med / base, "max_param_diff_vs_torch": diffs[name]}
    return rows


def _process_group(device, rank: int = 0, size: int = 1, addr: str = "127.0.0.1", port: int = 0):
    """torch.distributed's group (NCCL on a GPU, Gloo on a CPU); port 0: a free one (1 rank only)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        if not port:
            with socket.socket() as s:  # a free port: another job on this machine may hold any fixed one
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method=f"tcp://{addr}:{port}",
                                rank=rank, world_size=size)
    return dist


def _one_allreduce(who: str, t, name: str):
    """The sum of ``t`` over the ranks, by Horovod or by torch.distributed (into a copy: ``t`` stays the input)."""
    if who == "horovod":
        import horovod.torch as hvd

        return hvd.allreduce(t, op=hvd.Sum, name=name)
    import torch.distributed as dist

    out = t.clone()
    dist.all_reduce(out)
    return out


def allreduce_sweeps(sizes: str, iters: int, device) -> dict:
    """``hvd.allreduce`` and ``torch.distributed.all_reduce`` (its group already made) on float32 tensors of each size
    in MiB, interleaved size by size, every result checked against the arithmetic; median time per operation."""
    import horovod.torch as hvd

    rows: dict = {"horovod": [], "torch_distributed": []}
    world = hvd.size()
    for mib in [float(v) for v in sizes.split(",")]:
        n = int(mib * 2**20 // 4)
        t = torch.arange(n, device=device, dtype=torch.float32).remainder_(1000.0)
        expect = t * world  # whole numbers: exact in float32 for any order of summation
        for who in ("horovod", "torch_distributed"):
            for i in range(3):  # warm-up: the communicator, the fusion buffer
                _one_allreduce(who, t, f"w{mib}.{i}")
            times, ok = [], True
            for _ in range(iters):
                _sync(device)
                t0 = time.perf_counter()
                out = _one_allreduce(who, t, f"s{mib}")
                _sync(device)
                times.append(time.perf_counter() - t0)
                ok = ok and bool(torch.equal(out, expect))
            med = statistics.median(times)
            rows[who].append({"mib": mib, "ranks": world, "median_ms": med * 1e3, "min_ms": min(times) * 1e3,
                              "algbw_gb_s": mib * 2**20 / med / 1e9, "correct": ok, "on": str(out.device)})
            print(f"  {who:17s} {world} rank(s) {mib:6.0f} MiB: {med * 1e3:8.3f} ms  correct={ok}", flush=True)
    return rows


def _horovod(result: dict, device) -> str | None:
    """Horovod and hvdsync's init, or why not (the run then measures plain torch and DDP, and fails)."""
    try:
        import horovod
        import horovod.torch as hvd

        from hvdsync.config import Config
        from hvdsync.torch import init
    except ImportError as e:
        return f"Horovod/hvdsync not importable ({type(e).__name__}: {e})"
    # The timeline started and stopped around the proof's steps only (hvd.start_timeline needs this at init).
    os.environ.setdefault("HOROVOD_TIMELINE", "DYNAMIC")
    init(Config())  # hvdsync's init (Horovod knobs, seeds, GPU pinning); tracking is a fit-loop concern
    result["horovod"] = {"version": horovod.__version__, "size": hvd.size(), "nccl_built": bool(hvd.nccl_built()),
                         "gloo_built": bool(hvd.gloo_built()), "cuda_built": bool(hvd.cuda_built())}
    # hvdsync.torch must not drag in the other framework or MLflow (a GPU node may have neither).
    result["imported"] = {m: m in sys.modules for m in ("mlflow", "tensorflow", "keras")}
    if device.type == "cuda" and not hvd.nccl_built():
        return ("Horovod here is built without NCCL, so its GPU all-reduce is not NCCL's: rebuild it with "
                "HVDSYNC_HOROVOD_GPU=nccl bash scripts/build_horovod.sh")
    return None


def main(argv=None) -> int:
    a = _args(argv)
    device = torch.device(a.device)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    result: dict = {"argv": sys.argv[1:], "python": platform.python_version(), "torch": torch.__version__,
                    "cuda": torch.version.cuda, "device": torch.cuda.get_device_name() if device.type == "cuda" else
                    platform.processor() or "cpu", "settings": {k: v for k, v in vars(a).items() if k != "json"}}
    wrong: list[str] = []
    names = ["torch", "ddp"]
    refused = _horovod(result, device)
    if refused:
        result["horovod_error"] = refused
        wrong.append(refused)
        print(f"{refused}: plain torch and DDP only", flush=True)
    else:
        names += ["horovod", "hvdsync"]
    result["facts"] = gpu_checks.facts(device)
    print("facts: " + ", ".join(f"{k} {v}" for k, v in result["facts"].items()), flush=True)
    _process_group(device)
    start, data = _start(a, device)
    build = _builder(a, data)
    print(f"throughput: {result['device']}, batch {a.batch}, {a.image}px, width {a.width}, amp {a.amp}, "
          f"{a.reps} interleaved repetitions of {', '.join(names)}", flush=True)
    t0 = time.perf_counter()
    result["throughput"] = throughput(a, build, device, start, names)
    result["throughput_seconds"] = time.perf_counter() - t0
    for name, row in result["throughput"].items():
        print(f"{name:8s} median {row['median']:9.1f} img/s  ratio {row['ratio_to_torch']:.3f}", flush=True)
    check = gpu_checks.param_check(start, data, device, names, lambda *x, **k: build(*x, amp=False, **k))
    result["param_check"] = check
    print(f"parameters after {check['steps']} float32 steps, relative to torch's movement (tolerance "
          f"{check['tolerance']:g}; a gradient off by one rank: {check['off_by_one_rank']:.3f}): " +
          ", ".join(f"{n} {r['relative_diff']:.1e}" for n, r in check["contenders"].items()), flush=True)
    wrong += [f"{n}'s parameters off by {r['relative_diff']:.2e} of torch's movement"
              for n, r in check["contenders"].items() if not r["correct"]]
    if check["off_by_one_rank"] < 10 * check["tolerance"]:  # the check itself must be able to see the bug
        wrong.append(f"the parameter check cannot see a reduction off by one rank ({check['off_by_one_rank']:.2e})")
    print("all-reduces in the contenders' steps", flush=True)
    result["ddp_proof"] = gpu_checks.ddp_proof(start, data, device, build)
    if not result["ddp_proof"]["every_gradient_every_step"]:
        wrong.append(f"ddp: {result['ddp_proof']['bucket_allreduces']} bucket all-reduces in "
                     f"{result['ddp_proof']['steps']} steps")
    if not refused:
        result["allreduce_proof"] = gpu_checks.allreduce_proof(start, data, device, names, build)
        wrong += [f"{n}: {r['allreduces']} all-reduces in {r['steps']} steps of {r['gradients']} gradients, "
                  f"transport {r['transport']}" for n, r in result["allreduce_proof"].items()
                  if not r["every_gradient_every_step"]]
        sweeps = allreduce_sweeps(a.sizes, a.iters, device)
        result["allreduce_horovod"], result["allreduce_torch_distributed"] = sweeps["horovod"], \
            sweeps["torch_distributed"]
        wrong += [f"{who} all-reduce {r['mib']} MiB gave a wrong sum" for who, rows in sweeps.items() for r in rows
                  if not r["correct"]]
    import torch.distributed as dist

    dist.destroy_process_group()
    result["wrong"] = wrong
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    if wrong:
        print(f"WRONG: {'; '.join(wrong)}", flush=True)
    return 1 if wrong else 0


def sweep_main(argv=None) -> int:
    """N ranks (``horovodrun -np N``), one GPU each: Horovod's all-reduce against torch.distributed's, NCCL both."""
    p = argparse.ArgumentParser(prog="gpu.py sweep", description=sweep_main.__doc__, epilog=suite.RECORD_HELP)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--sizes", default="1,4,16,64,256", help="all-reduce sizes in MiB")
    p.add_argument("--iters", type=int, default=20, help="timed all-reduces per size")
    p.add_argument("--json", default="", help="write the results here (rank 0)")
    a = p.parse_args(argv)
    device = torch.device(a.device)
    result: dict = {"argv": sys.argv[1:]}
    refused = _horovod(result, device)
    if refused:
        print(refused, flush=True)
        return 1
    import horovod.torch as hvd

    from hvdsync.torch.runtime import device as rank_device

    device = rank_device() if device.type == "cuda" else device
    port = 0
    if hvd.rank() == 0:
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
    # Rank 0's host and a free port there, handed to every rank by Horovod itself.
    addr, port = hvd.broadcast_object((socket.gethostname() if hvd.size() > 1 else "127.0.0.1", port), root_rank=0)
    _process_group(device, hvd.rank(), hvd.size(), addr, port)
    result["facts"] = gpu_checks.facts(device)
    result.update(allreduce_sweeps(a.sizes, a.iters, device))
    import torch.distributed as dist

    dist.destroy_process_group()
    wrong = [f"{who} {r['mib']} MiB" for who in ("horovod", "torch_distributed") for r in result[who]
             if not r["correct"]]
    if a.json and hvd.rank() == 0:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    if wrong:
        print(f"WRONG: {', '.join(wrong)}", flush=True)
    return 1 if wrong else 0


SUITE_PARTS = {"bench": suite.Part(main, "one GPU: plain torch vs DDP vs raw Horovod vs hvdsync (img/s, ratio to "
                                        "torch, parameters checked, NCCL proven), all-reduce 1-256 MiB"),
               "sweep": suite.Part(sweep_main, suite.first_line(sweep_main.__doc__)),
               "links": suite.Part(gpu_links.main, suite.first_line(gpu_links.__doc__))}

if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(suite.run(__file__, SUITE_PARTS, default="bench", doc=__doc__))
