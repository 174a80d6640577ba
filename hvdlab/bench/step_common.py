"""What every training-step contender shares, whatever its framework (``training.py`` runs them).

The same work for all: a model whose parameters start from the same numbers (drawn here with numpy, so that they do
not depend on a framework's initialisers or on the process), the same synthetic samples, and the same global batch
of every step, cut per rank by :class:`hvdsync.torch.ShardPlan` without shuffling (rank r reads the r-th
half of each global batch). Plain SGD without momentum: after the same steps, one process on the whole global
batch and two workers averaging the gradients of their halves end with the same parameters up to float rounding,
which is what :func:`fingerprint` lets the driver check.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, field

import numpy as np

# The test-only switch: the named contender skips its gradient synchronisation (each rank steps on its own half).
# It is then faster and wrong, and the benchmark must say "wrong", not "fast".
WRONG_ENV = "HVDSYNC_BENCH_WRONG"
SAMPLE = 20_000  # parameter positions compared with the 1-process run (every tensor's sum is compared too)


@dataclass
class Work:
    """One model and its data.

    Args:
        model: ``mlp`` (``features``-``hidden``-``hidden``-``classes``, ReLU) or ``cnn`` (hvdsync's ResNet-style CNN
            of width ``hidden`` on ``image`` x ``image`` x 3 images).
        global_batch: samples per optimizer step over all ranks (each of 2 workers reads half).
        warmup, steps: untimed, then timed steps of one repetition.
        lr: SGD's learning rate (no momentum).
    """

    model: str = "mlp"
    features: int = 1024
    hidden: int = 4096
    classes: int = 10
    image: int = 16
    global_batch: int = 64
    warmup: int = 2
    steps: int = 6
    lr: float = 0.01

    @property
    def samples(self) -> int:
        return self.global_batch * (self.warmup + self.steps)

    def input_shape(self) -> tuple[int, ...]:
        return (self.features,) if self.model == "mlp" else (self.image, self.image, 3)


@dataclass
class Spec:
    """One contender as its workers see it."""

    name: str
    framework: str
    kind: str  # single | raw | ddp | mwms | api | fit
    work: dict = field(default_factory=dict)
    sync: dict | None = None  # SyncConfig fields for hvdsync's contenders (compression, accumulate, knobs)
    threads: int = 1
    world: int = 2

    def to_dict(self) -> dict:
        return asdict(self)


def data(work: Work) -> tuple[np.ndarray, np.ndarray]:
    """The training samples, identical in every process: Gaussian inputs, uniform labels."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((work.samples, *work.input_shape()), dtype=np.float32)
    y = rng.integers(0, work.classes, work.samples).astype(np.int64)
    return x, y


def plan(work: Work, world: int, accumulate: int = 1):
    """The shard plan every contender reads by (in order, no shuffling)."""
    from hvdsync.core.train._plan import ShardPlan

    return ShardPlan(work.samples, world, work.global_batch // world, accumulate, seed=0, shuffle=False)


def start_values(shapes: list[tuple[int, ...]], fan_in_axes: str) -> list[np.ndarray | None]:
    """Start values for every tensor of 2 or more dimensions (``None``: keep the layer's own, a deterministic zero or
    one), scaled by 1/sqrt(fan-in). ``fan_in_axes``: ``"last_out"`` (Keras: ``(..., in, out)``) or ``"first_out"``
    (PyTorch: ``(out, in, ...)``)."""
    out = []
    for i, shape in enumerate(shapes):
        if len(shape) < 2:
            out.append(None)
            continue
        fan_in = math.prod(shape[:-1]) if fan_in_axes == "last_out" else math.prod(shape[1:])
        rng = np.random.default_rng([2, i])
        out.append(rng.standard_normal(shape, dtype=np.float32) / np.float32(math.sqrt(fan_in)))
    return out


def fingerprint(params: list[np.ndarray]) -> dict:
    """What the driver compares: ``SAMPLE`` fixed positions of all parameters flattened, and each tensor's sum."""
    flat = np.concatenate([np.asarray(p, dtype=np.float32).ravel() for p in params])
    idx = np.random.default_rng(3).choice(flat.size, size=min(SAMPLE, flat.size), replace=False)
    return {"sample": flat[idx].astype(np.float64), "sums": np.array([float(np.sum(p, dtype=np.float64))
                                                                        for p in params]), "numel": int(flat.size)}


def wrong(name: str) -> bool:
    return os.environ.get(WRONG_ENV) == name


def timed_steps(step, batches: list, warmup: int) -> list[float]:
    """Run ``step(batch)`` for each batch; the seconds of each after the first ``warmup``."""
    times = []
    for i, batch in enumerate(batches):
        t0 = time.perf_counter()
        step(batch)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return times


def step_clock(warmup: int, times: list, params: list):
    """A :class:`hvdsync.core.train.callbacks.Callback` for ``fit``: the seconds of each step after ``warmup`` into
    ``times``, the final parameters into ``params``. It runs after hvdsync's own per-step observer, so the figure
    includes what ``fit`` adds to a step."""
    from hvdsync.core.train.callbacks import Callback

    class Clock(Callback):
        def on_step_begin(self, ctx):
            self.t0 = time.perf_counter()

        def on_step_end(self, ctx):
            if ctx.global_step > warmup:
                times.append(time.perf_counter() - self.t0)

        def on_train_end(self, ctx):
            params.extend(ctx.backend.parameters())

    return Clock()


def fit_config(spec: Spec, work: Work):
    """The :class:`hvdsync.config.Config` under which ``fit`` does the same work: the per-rank half of the global
    batch, no shuffling, one epoch, plain SGD at ``work.lr`` (not scaled), no tracking."""
    from hvdsync.config import Config

    return Config.from_dict({
        "sync": spec.sync or {}, "tracking": {"enabled": False},
        "data": {"batch_size": work.global_batch // spec.world, "shuffle": False},
        "train": {"framework": spec.framework, "np": spec.world, "epochs": 1, "lr": work.lr, "lr_scaling": "none",
                  "optimizer": "sgd", "momentum": 0.0}})


def works(quick: bool) -> dict[str, Work]:
    """The models of ``benchmarks/training.py`` (``quick``: tiny ones that exercise every path in seconds)."""
    if quick:
        return {"mlp": Work("mlp", features=64, hidden=128, global_batch=16, warmup=1, steps=2),
                "cnn": Work("cnn", hidden=8, image=8, global_batch=16, warmup=1, steps=2)}
    # MLP: 1024-4096-4096-10 = 21.0 M parameters (84 MB of float32 gradient per step) against ~8 GFLOP per global
    # batch of 64: the all-reduce weighs as much as the compute. CNN: hvdsync's ResNet-style CNN of width 16 (10 k
    # parameters) on 16x16x3 images: compute-bound, Horovod's per-step latency shows.
    return {"mlp": Work("mlp", features=1024, hidden=4096, global_batch=64, warmup=2, steps=5),
            "cnn": Work("cnn", hidden=16, image=16, global_batch=128, warmup=2, steps=8)}
