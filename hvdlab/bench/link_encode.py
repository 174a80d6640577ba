"""A codec's encode + decode time on the gradients of one step, measured on the workers: the cost model's
encoding term (:func:`hvdlab.costmodel.step_time`).

On a CPU the codec's own arithmetic (a top-k over 4 M values, PowerSGD's matrix products, a cast) takes the
same cores as the rest of the step; over a slow link it is what is left once the bytes have shrunk. The codec runs
here exactly as in training (:func:`hvdsync.core.comm.codecs.driver.reduce_all` with the framework's own kernels),
but its collectives are answered locally with what they would return if every rank held the same gradient: an
all-reduce returns its input, an all-gather ``size`` copies of it. So the timing holds the encoding and the
decoding of ``size`` ranks' pieces, and no transfer. Every worker times at once, with the intra-op threads training
uses, so the measurement shares the CPUs as training does.
"""
from __future__ import annotations

import statistics
import time
from typing import Sequence

import numpy as np


def _torch_kit(threads: int):
    import torch

    from hvdsync.torch.compression import TorchOps

    torch.set_num_threads(threads)
    return TorchOps(), torch.from_numpy, lambda xs: torch.cat(xs, 0), lambda fn: fn


def _tf_kit(threads: int):
    import tensorflow as tf

    from hvdsync.tensorflow.compression import TFOps

    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
    except RuntimeError:  # already initialised in this process: keep its setting
        pass
    # tf.function: training runs the codec inside the compiled step; eagerly, each kernel's dispatch would cost more
    # than the arithmetic on a small model.
    return TFOps(), tf.convert_to_tensor, lambda xs: tf.concat(xs, 0), tf.function


KITS = {"torch": _torch_kit, "tensorflow": _tf_kit}


def time_codecs(framework: str, specs: Sequence[str], shapes: Sequence[tuple[int, ...]], size: int = 2,
                repeats: int = 5, threads: int | None = None, seed: int = 0) -> dict[str, float]:
    """Median seconds of one step's encode + decode per codec spec (``"none"``, ``"fp16"``, ``"topk:0.01"``...).

    Args:
        framework: ``torch`` or ``tensorflow`` (whose kernels the codec runs on).
        specs: ``sync.compression`` values.
        shapes: the gradients' shapes.
        size: ranks the decoding combines (all-gathered pieces are ``size`` copies).
        repeats: timed runs after one warm-up (the median is returned).
        threads: intra-op threads (default: as :func:`hvdsync.core.train.seeding.threads_per_worker` with one
            worker per host).

    Example:
        >>> t = time_codecs("torch", ["none", "topk:0.01"], [(256, 64)], repeats=3)   # doctest: +SKIP
        >>> t["none"] == 0.0 and t["topk:0.01"] > 0
        True
    """
    from hvdsync.core.comm.codecs.base import Allreduce, ReduceContext
    from hvdsync.core.comm.codecs.driver import reduce_all
    from hvdsync.core.comm.codecs.registry import get_codec
    from hvdsync.core.comm.codecs.state import CodecState
    from hvdsync.core.train.seeding import threads_per_worker

    if framework not in KITS:
        raise ValueError(f"framework: {framework!r} is not allowed; choose one of: {', '.join(KITS)}")
    ops, to_tensor, concat, compile_ = KITS[framework](threads or threads_per_worker(1))
    rng = np.random.default_rng(seed)
    grads = [to_tensor(rng.standard_normal(s).astype(np.float32)) for s in shapes]

    def answer(requests):  # what the collectives return when every rank sent the same tensor
        return [r.tensor if isinstance(r, Allreduce) else concat([r.tensor] * size) for r in requests]

    out = {}
    for spec in specs:
        codec = get_codec(spec)
        if codec.cast:
            if codec.wire_dtype is None:  # "none": Horovod gets the gradient as it is
                out[spec] = 0.0
                continue

            def step(codec=codec):
                return [codec.decode(ops, codec.encode(ops, g), "float32") for g in grads]
        else:
            state = CodecState(codec, shapes, ops, seed)
            ctx = ReduceContext(size, True, True, seed, 0)

            def step(codec=codec, state=state, ctx=ctx):
                return reduce_all(codec, ops, grads, state, ctx, answer)
        once = compile_(step)
        [ops.to_numpy(x) for x in once()]  # warm-up: first-call allocations, tracing
        runs = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            [ops.to_numpy(x) for x in once()]  # to_numpy waits for the result, as the optimizer's update would
            runs.append(time.perf_counter() - t0)
        out[spec] = statistics.median(runs)
    return out


def mlp_shapes(framework: str, features: int, hidden: int, classes: int = 10) -> list[tuple[int, ...]]:
    """The gradient shapes of hvdsync's one-hidden-layer ``mlp`` (torch stores a weight as (out, in), Keras as
    (in, out): PowerSGD's factors follow the orientation)."""
    w1, w2 = ((hidden, features), (classes, hidden)) if framework == "torch" else ((features, hidden), (hidden, classes))
    return [w1, (hidden,), w2, (classes,)]


def call_seconds(hvd, tensor, repeats: int = 30) -> float:
    """Median seconds of one Horovod call that moves (almost) nothing: a grouped all-reduce of two 1-element tensors,
    as a codec's round is one grouped request. What a round costs before its bytes: the request waits for the
    background thread's next cycle, rank 0 negotiates it with every rank, then a ring of a few bytes. The figure
    :func:`hvdlab.torch.measure.collective_times` calls ``call`` (a plain 4-byte all-reduce, PyTorch only, timed
    among its patterns); this one takes either framework's ``hvd``, inside a link job."""
    runs = []
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        hvd.grouped_allreduce([tensor, tensor], name=f"link_encode.call.{i}")
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs[1:])


def on_workers(framework: str, specs: Sequence[str], shapes: Sequence[tuple[int, ...]], repeats: int = 5) -> dict:
    """Run on every Horovod worker (:func:`hvdsync.launch.run`): all ranks time at once (after a barrier), so the
    timing shares the host's cores as training does. Returns this rank's ``{"encode": time_codecs(...), "call":
    call_seconds(...)}``: each codec's encoding, and the cost of one Horovod call over the job's link."""
    import importlib

    from hvdsync.core.train.seeding import threads_per_worker

    hvd = importlib.import_module(f"horovod.{framework}")  # a worker imports one framework
    hvd.init()
    one = np.zeros(1, np.float32) if framework == "tensorflow" else __import__("torch").zeros(1)
    hvd.allreduce(one, name="link_encode.barrier")
    call = call_seconds(hvd, one)
    return {"encode": time_codecs(framework, specs, shapes, hvd.size(), repeats, threads_per_worker(hvd.local_size())),
            "call": call}
