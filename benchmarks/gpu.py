"""On a GPU machine: hvdsync's training step against plain torch, Horovod's all-reduce on GPU tensors, the links.

    bash benchmarks/gpu.sh                       # build Horovod with NCCL, check it, then the bench part, recorded
    python benchmarks/gpu.py --cpu                  # the bench part's self-test on a CPU, in seconds
    python benchmarks/gpu.py links --json gpu.json  # PCIe, HBM and (2+ GPUs) NCCL figures for the cost model

Two parts: ``bench`` (the default, below) and ``links`` (:mod:`hvdlab.bench.gpu_links`); ``PART --help`` gives a
part's options. ``bench`` is run by ``benchmarks/gpu.sh`` (after it builds Horovod with NCCL) as
``horovodrun -np 1 python benchmarks/gpu.py bench``; it also runs as a plain ``python`` process (Horovod then starts a
1-rank job by itself). One GPU, one process, two questions, answered in one run and written as JSON (``--json``):

- **Throughput**: a ResNet-style CNN (basic residual blocks, batch norm) on synthetic images already on the GPU, the
  same model start, batch, optimizer and step count for every contender: (a) plain torch, (b) a raw Horovod loop
  (``hvd.DistributedOptimizer``), (c) hvdsync's adapter (``hvdsync.torch.init`` + ``distributed_optimizer`` +
  ``broadcast_state``). Repetitions are interleaved (a, b, c, a, b, c, ...) so clock and thermal drift hit each alike;
  the figure is images per second, median over repetitions, and the ratio to plain torch (target: >= 0.97). Each
  contender's final parameters are compared with plain torch's after the same steps (a fast but wrong contender is
  reported as wrong). At one rank Horovod would skip the all-reduce (``hvd.DistributedOptimizer`` registers its hooks
  only where ``size() > 1``, and hvdsync's grouped call returns at once), so (b) and (c) would time plain torch: their
  optimizers are built with the hooks forced on (:func:`_hooks_at_one_rank`), and every step all-reduces every
  gradient through Horovod's core, as on N ranks, with no bytes crossing a link. Two more untimed steps per contender
  under Horovod's timeline prove it (``allreduce_proof`` in the JSON: all-reduces per step = gradient tensors, and
  the transport, ``NCCL_ALLREDUCE`` on a GPU); a contender whose steps ran no all-reduce is reported as wrong.
- **All-reduce sweep**: ``hvd.allreduce`` on float32 GPU tensors of 1-256 MiB (NCCL when Horovod was built with it),
  the result checked, median time per operation; ``torch.distributed`` NCCL with the same 1 rank as the reference.
  With one rank no bytes cross a link: the figure is Horovod's per-operation cost on the GPU path (fusion-buffer copies,
  the background loop, the NCCL call), not a network bandwidth.

``--cpu`` (= ``--device cpu --quick``) runs every path on a CPU in seconds, the all-reduces over Gloo (the self-test:
tests/unit/test_gpu_bench.py; no figure from it means anything but the proof that the all-reduces ran).
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
import tempfile
import time

import torch
from torch import nn

from hvdlab.bench import gpu_links, suite


def _args(argv=None):
    p = argparse.ArgumentParser(prog="gpu.py bench", epilog=suite.RECORD_HELP,
                                description="One GPU, one process: hvdsync's training step against plain torch, and "
                                            "Horovod's all-reduce on GPU tensors.")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--image", type=int, default=224, help="image side in pixels")
    p.add_argument("--width", type=int, default=64, help="channels of the first stage (ResNet-18: 64)")
    p.add_argument("--steps", type=int, default=40, help="timed steps per repetition")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps per repetition")
    p.add_argument("--reps", type=int, default=5)
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
        a.batch, a.image, a.width, a.steps, a.warmup, a.reps, a.sizes, a.iters = 8, 32, 8, 3, 1, 2, "1", 3
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


CONTENDERS = {"torch": _plain, "horovod": _raw_horovod, "hvdsync": _hvdsync}


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def _contender(a, name, device, start_state, data):
    """One contender's model from the common start and its training step."""
    model = resnet(a.width).to(device)
    model.load_state_dict(start_state)
    opt = CONTENDERS[name](model)
    x, y = data
    loss_fn = nn.CrossEntropyLoss()
    amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=a.amp == "bf16")

    def step():
        opt.zero_grad()  # Horovod 0.28.1 takes no set_to_none (torch: None by default)
        with amp:
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()

    return model, step


def _train(a, name, device, start_state, data):
    """One repetition of one contender from the common start; (images per second, final parameters)."""
    model, step = _contender(a, name, device, start_state, data)
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


def allreduce_proof(a, device, names, steps: int = 2):
    """Each Horovod contender's all-reduces in ``steps`` untimed steps, from Horovod's own timeline (its core writes
    a span per collective it ran): the count per step against the gradient tensors, and the transport's kernels."""
    import horovod.torch as hvd

    from hvdsync.core.telemetry import timeline

    start, data = _start(a, device)
    rows = {}
    with tempfile.TemporaryDirectory() as folder:
        for name in names:
            if name == "torch":
                continue
            model, step = _contender(a, name, device, start, data)
            step()  # outside the timeline: the first step's negotiations and buffers
            _sync(device)
            path = os.path.join(folder, f"{name}.json")
            hvd.start_timeline(path)
            for _ in range(steps):
                step()
            _sync(device)
            hvd.stop_timeline()
            spans = timeline.read(path).select("ALLREDUCE")
            gradients = sum(1 for p in model.parameters() if p.requires_grad)
            rows[name] = {"gradients": gradients, "steps": steps, "allreduces": len(spans),
                          "transport": sorted({act.name for s in spans for act in s.activities
                                               if act.name.endswith("_ALLREDUCE")}),
                          "every_gradient_every_step": len(spans) == steps * gradients}
            print(f"  {name:8s} {len(spans)} all-reduces in {steps} steps of {gradients} gradients "
                  f"({', '.join(rows[name]['transport']) or 'none'})", flush=True)
    return rows


def throughput(a, device, names):
    start, (x, y) = _start(a, device)
    rates: dict[str, list[float]] = {n: [] for n in names}
    diffs: dict[str, float] = {}
    for rep in range(a.reps):
        finals = {}
        for name in names:  # interleaved: a, b, c, a, b, c, ...
            rate, finals[name] = _train(a, name, device, start, (x, y))
            rates[name].append(rate)
            print(f"  rep {rep}: {name:8s} {rate:9.1f} img/s", flush=True)
        for name in names:
            diffs[name] = max(diffs.get(name, 0.0), max(float((p - q).abs().max()) for p, q in
                                                        zip(finals[name], finals["torch"])))
    base = statistics.median(rates["torch"])
    rows = {}
    for name in names:
        med = statistics.median(rates[name])
        # The same steps from the same start: the parameters must agree with plain torch's up to the GPU's
        # non-deterministic reductions (cuDNN's algorithms, atomics), orders of magnitude below a real bug.
        rows[name] = {"images_per_s": rates[name], "median": med, "min": min(rates[name]), "max": max(rates[name]),
                      "ratio_to_torch": med / base, "max_param_diff_vs_torch": diffs[name],
                      "correct": diffs[name] < 5e-2}
    return rows


def allreduce_sweep(a, device):
    import horovod.torch as hvd

    rows = []
    for mib in [float(s) for s in a.sizes.split(",")]:
        n = int(mib * 2**20 // 4)
        t = torch.arange(n, device=device, dtype=torch.float32).remainder_(1000.0)
        expect = t * hvd.size()
        for i in range(3):  # warm-up: NCCL's communicator, the fusion buffer
            hvd.allreduce(t, op=hvd.Sum, name=f"w{mib}.{i}")
        times, ok = [], True
        for _ in range(a.iters):
            _sync(device)
            t0 = time.perf_counter()
            out = hvd.allreduce(t, op=hvd.Sum, name=f"s{mib}")
            _sync(device)
            times.append(time.perf_counter() - t0)
            ok = ok and bool(torch.equal(out, expect))
        med = statistics.median(times)
        rows.append({"mib": mib, "median_ms": med * 1e3, "min_ms": min(times) * 1e3,
                     "algbw_gb_s": mib * 2**20 / med / 1e9, "correct": ok, "on": str(out.device)})
        print(f"  horovod allreduce {mib:6.0f} MiB: {med * 1e3:8.3f} ms  correct={ok}", flush=True)
    return rows


def torch_distributed_sweep(a, device):
    """The same sizes through torch.distributed (NCCL on a GPU, Gloo on a CPU), 1 rank: the reference."""
    import torch.distributed as dist

    if not dist.is_initialized():
        with socket.socket() as s:  # a free port: another job on this machine may hold any fixed one
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                                rank=0, world_size=1)
    rows = []
    for mib in [float(s) for s in a.sizes.split(",")]:
        n = int(mib * 2**20 // 4)
        t = torch.arange(n, device=device, dtype=torch.float32).remainder_(1000.0)
        for _ in range(3):
            dist.all_reduce(t.clone())
        times, ok = [], True
        for _ in range(a.iters):
            out = t.clone()
            _sync(device)
            t0 = time.perf_counter()
            dist.all_reduce(out)
            _sync(device)
            times.append(time.perf_counter() - t0)
            ok = ok and bool(torch.equal(out, t))
        med = statistics.median(times)
        rows.append({"mib": mib, "median_ms": med * 1e3, "min_ms": min(times) * 1e3, "correct": ok})
        print(f"  torch.distributed all_reduce {mib:6.0f} MiB: {med * 1e3:8.3f} ms  correct={ok}", flush=True)
    dist.destroy_process_group()
    return rows


def main(argv=None) -> int:
    a = _args(argv)
    device = torch.device(a.device)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    result: dict = {"argv": sys.argv[1:], "python": platform.python_version(), "torch": torch.__version__,
                    "cuda": torch.version.cuda, "device": torch.cuda.get_device_name() if device.type == "cuda" else
                    platform.processor() or "cpu", "settings": {k: v for k, v in vars(a).items() if k != "json"}}
    names = ["torch"]
    try:
        import horovod
        import horovod.torch as hvd

        from hvdsync.config import Config
        from hvdsync.torch import init

        # hvdsync's init (Horovod knobs, seeds, GPU pinning); tracking is a fit-loop concern and stays out of this.
        cfg = Config()
        # The timeline started and stopped around the proof's steps only (hvd.start_timeline needs this at init).
        os.environ.setdefault("HOROVOD_TIMELINE", "DYNAMIC")
        init(cfg)
        result["horovod"] = {"version": horovod.__version__, "size": hvd.size(), "nccl_built": bool(hvd.nccl_built()),
                             "gloo_built": bool(hvd.gloo_built()), "cuda_built": bool(hvd.cuda_built())}
        # hvdsync.torch must not drag in the other framework or MLflow (a GPU box may have neither).
        result["imported"] = {m: m in sys.modules for m in ("mlflow", "tensorflow", "keras")}
        names += ["horovod", "hvdsync"]
    except ImportError as e:  # still measure plain torch, and say why the rest is missing
        result["horovod_error"] = f"{type(e).__name__}: {e}"
        print(f"Horovod/hvdsync not importable ({e}): plain torch only", flush=True)
    print(f"throughput: {result['device']}, batch {a.batch}, {a.image}px, width {a.width}, amp {a.amp}", flush=True)
    t0 = time.perf_counter()
    result["throughput"] = throughput(a, device, names)
    result["throughput_seconds"] = time.perf_counter() - t0
    for name, row in result["throughput"].items():
        print(f"{name:8s} median {row['median']:9.1f} img/s  ratio {row['ratio_to_torch']:.3f}  "
              f"max|dparam| {row['max_param_diff_vs_torch']:.2e}  correct={row['correct']}", flush=True)
    if "horovod" in names:
        print("all-reduces in the contenders' steps (Horovod's timeline)", flush=True)
        result["allreduce_proof"] = allreduce_proof(a, device, names)
        result["allreduce_horovod"] = allreduce_sweep(a, device)
    try:
        result["allreduce_torch_distributed"] = torch_distributed_sweep(a, device)
    except Exception as e:  # the reference is optional; its failure must not hide the rest
        result["allreduce_torch_distributed_error"] = f"{type(e).__name__}: {e}"
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    wrong = [n for n, r in result["throughput"].items() if not r["correct"]]
    wrong += [f"allreduce {r['mib']} MiB" for r in result.get("allreduce_horovod", []) if not r["correct"]]
    wrong += [f"{n}: {r['allreduces']} all-reduces in {r['steps']} steps of {r['gradients']} gradients"
              for n, r in result.get("allreduce_proof", {}).items() if not r["every_gradient_every_step"]]
    if wrong:
        print(f"WRONG: {', '.join(wrong)}", flush=True)
    return 1 if wrong else 0


SUITE_PARTS = {"bench": suite.Part(main, "one GPU: plain torch vs raw Horovod vs hvdsync (img/s, ratio to torch, "
                                        "parameters checked), Horovod all-reduce 1-256 MiB"),
               "links": suite.Part(gpu_links.main, suite.first_line(gpu_links.__doc__))}

if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(suite.run(__file__, SUITE_PARTS, default="bench", doc=__doc__))
