"""Gradient codecs in PyTorch: the kernels (:class:`TorchOps`) and the two ways gradients travel.

The maths of every codec is in :mod:`hvdsync.core.comm.codecs`; here are only torch kernels and Horovod calls.

* Cast codecs (``none``, ``fp16``) keep the gradient's shape: :class:`CodecCompressor` is Horovod's
  ``compression=`` hook, so ``hvd.DistributedOptimizer`` keeps all-reducing asynchronously from the backward hooks.
  Horovod calls ``compress`` right before the all-reduce, so what it returns is exactly what travels; the
  :class:`~hvdsync.core.comm.codecs.WireCounter` records it.
* The other codecs (top-k, rand-k, int8, PowerSGD) send other shapes (values and indices, factors), and ``bf16`` a
  dtype Horovod cannot all-reduce (its bits by allgather), which Horovod's hook cannot do. :class:`CodecOptimizer`
  reduces after the backward pass, in ``synchronize()``, through :class:`CodecReducer`: the core's reducer
  (:mod:`hvdsync.core.comm.reducer`) runs the codec and counts, and each round becomes one grouped all-reduce and
  one grouped allgather here (:class:`TorchCollectives`).
"""
from __future__ import annotations

import contextlib
import time
from typing import Iterable, Sequence

import horovod.torch as hvd
import torch

from hvdsync.core.comm.codecs import mix_seed, WireCounter
from hvdsync.core.comm.codecs.base import Codec
from hvdsync.core.comm.codecs.registry import get_codec
from hvdsync.core.comm.reducer import CodecReducer as _CoreReducer
from hvdsync.core.comm.reducer import Collectives
from hvdsync.torch.runtime import wait
from hvdsync.torch.sparse import densify

_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64,
           "int8": torch.int8, "int16": torch.int16, "int32": torch.int32, "int64": torch.int64}


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


_SAMPLE = 16384          # values sampled to place the candidate threshold
_SAMPLE_SEED = 0x5EED    # fixed: the choice of candidates never depends on the global RNG (reproducibility)


def exact_topk(x: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest values of a vector, largest first: exactly ``torch.topk(x, k).indices``'s values.

    ``torch.topk`` over millions of values costs ~75 ms per 4 M on a CPU core, most of a top-1 % codec's encoding.
    With k small against n, a threshold from a fixed sample (placed so that about 2k values lie above it) keeps
    ~2k candidates in one pass, and top-k of those is the top-k of all: when at least k values are >= t, the k-th
    largest is >= t, so every one of the k largest is a candidate. Where the sample misleads (fewer than k
    candidates), it falls back to the full ``torch.topk``. Same values, same order; among exactly equal values at
    the k-th place the one kept may differ."""
    n = x.numel()
    if n < 4 * _SAMPLE or 8 * k > n:
        return torch.topk(x, k).indices
    generator = torch.Generator(device=x.device).manual_seed(_SAMPLE_SEED)
    sample = x[torch.randint(0, n, (_SAMPLE,), generator=generator, device=x.device)]
    above = max(1, int(2 * k * _SAMPLE / n))
    threshold = sample.kthvalue(_SAMPLE - above).values
    candidates = (x >= threshold).nonzero().squeeze(1)
    if candidates.numel() < k:
        return torch.topk(x, k).indices
    return candidates[torch.topk(x[candidates], k).indices]


class TorchOps:
    """:class:`hvdsync.core.comm.codecs.Ops` on torch tensors; slots are tensors on ``device``, updated in place.

    ``reuse_inputs``: :meth:`matmul_into` writes into the gradient it is given (:class:`CodecOptimizer`'s own
    gradients: a decoded PowerSGD gradient lands in ``.grad`` with no 16.8 MB tensor and copy per step for a
    4096 x 1024 layer); off, a caller's tensors are never written."""

    def __init__(self, device: torch.device | str = "cpu", reuse_inputs: bool = False) -> None:
        self.device = torch.device(device)
        self.reuse_inputs = reuse_inputs

    def dtype_name(self, x):
        return _dtype_name(x.dtype)

    def shape(self, x):
        return tuple(x.shape)

    def cast(self, x, dtype):
        return x.to(_DTYPES[dtype])

    def bitcast(self, x, dtype):
        return x.view(_DTYPES[dtype])

    def reshape(self, x, shape):
        return x.reshape(tuple(shape))

    def abs(self, x):
        return x.abs()

    def floor(self, x):
        return torch.floor(x)

    def max(self, x):
        return x.max().reshape(1)

    def maximum(self, x, floor):
        return torch.clamp_min(x, floor)

    def clip(self, x, low, high):
        return torch.clamp(x, low, high)

    def sqrt(self, x):
        return torch.sqrt(x)

    def sum(self, x, axis=None):
        return x.sum() if axis is None else x.sum(dim=axis)

    def matmul(self, a, b):
        return a @ b

    def matmul_into(self, out, a, b):
        rows, cols = a.shape[0], b.shape[1]
        if (self.reuse_inputs and out.is_contiguous() and out.numel() == rows * cols and out.dtype == a.dtype
                and not out.requires_grad):
            return torch.matmul(a, b, out=out.view(rows, cols))
        return a @ b

    def transpose(self, a):
        return a.t()

    def concat(self, xs, axis):
        return torch.cat(list(xs), dim=axis)

    def topk_indices(self, x, k):
        return exact_topk(x, k).to(torch.int32)

    def take(self, x, idx):
        return x[idx.long()]

    def scatter_add(self, n, idx, values):
        return torch.zeros(n, dtype=values.dtype, device=values.device).index_add_(0, idx.long(), values)

    def uniform(self, n, seed, step):
        generator = torch.Generator().manual_seed(mix_seed(seed, int(step)))
        return torch.rand(n, generator=generator).to(self.device)

    def all_finite(self, xs):
        return torch.stack([torch.isfinite(x).all() for x in xs]).all()

    def slot(self, value):
        return torch.from_numpy(value.copy()).to(self.device)

    def read(self, slot):
        return slot

    def assign(self, slot, value):
        slot.copy_(torch.as_tensor(value))

    def add_into(self, slot, x):
        return slot.add_(x.reshape(slot.shape))

    def sub_into(self, slot, x):
        slot.sub_(x.reshape(slot.shape))

    def zero_at(self, slot, idx):
        slot.view(-1).index_fill_(0, idx.long(), 0.0)

    def to_numpy(self, x):
        return x.detach().cpu().numpy()

    def from_numpy(self, a):
        return torch.from_numpy(a).to(self.device)


class _Cast(tuple):
    """``CodecCompressor``'s context for an in-place cast: ``(dtype name, the gradient, the wire buffer)``."""


class CodecCompressor:
    """Horovod ``compression=`` hook for cast codecs: ``compress`` runs the core codec's ``encode`` on torch
    tensors, ``decompress`` its ``decode``; every tensor handed over is counted.

    Args:
        codec: a cast codec or its config name (``"fp16"``).
        counter: records every tensor handed to Horovod.
        in_place: for ``hvd.DistributedOptimizer`` (what :func:`hvdsync.torch.distributed_optimizer` passes):
            ``compress`` casts into a wire buffer reused from step to step, and ``decompress`` casts the reduced
            values back into the gradient that was compressed and returns it (Horovod's ``p.grad.set_`` then
            points the gradient at itself). Without it, every step allocates a new float16 tensor and a new float32
            one per gradient: for a 21 M-parameter model ~100 MB of fresh pages a step (``benchmarks/step.py fp16``
            counts the page faults), as much CPU time as the halved transfer saves on a 2-core machine. Not for
            ``hvd.allreduce(x, compression=...)``, whose input must stay as it was.
    """

    def __init__(self, codec: Codec | str, counter: WireCounter | None = None, in_place: bool = False) -> None:
        self.codec = get_codec(codec) if isinstance(codec, str) else codec
        if not self.codec.cast:
            raise ValueError(f"compression: {self.codec.spec!r} is not allowed through Horovod's compression hook "
                             "(it changes the shape); use CodecOptimizer")
        self.counter = counter if counter is not None else WireCounter()
        self.ops = TorchOps()
        self.in_place = in_place
        # Free wire buffers by (shape, dtype, device). A list, not one buffer per key: two gradients of one shape
        # (two biases) are in flight at once. Taken in compress, given back in decompress (the reduction is done).
        self._free: dict[tuple, list[torch.Tensor]] = {}

    def compress(self, tensor: torch.Tensor):
        start = time.perf_counter()
        wire, ctx = self._compress(tensor)
        self.counter.add_codec_time(time.perf_counter() - start)
        return wire, ctx

    def _compress(self, tensor: torch.Tensor):
        ctx = _dtype_name(tensor.dtype)
        if self.in_place and self.codec.applies_to(ctx):
            wire_dtype = _DTYPES[self.codec.wire_dtype]
            free = self._free.get((tensor.shape, wire_dtype, tensor.device))
            wire = free.pop() if free else torch.empty(tensor.shape, dtype=wire_dtype, device=tensor.device)
            wire.copy_(tensor)  # the codec's encode (a cast to its wire dtype), into a buffer that already exists
            ctx = _Cast((ctx, tensor, wire))
        else:
            wire = self.codec.encode(self.ops, tensor)
        self.counter.record(wire.numel(), wire.element_size(), _dtype_name(wire.dtype))
        return wire, ctx

    def decompress(self, tensor: torch.Tensor, ctx):
        start = time.perf_counter()
        try:
            return self._decompress(tensor, ctx)
        finally:
            self.counter.add_codec_time(time.perf_counter() - start)

    def _decompress(self, tensor: torch.Tensor, ctx):
        if isinstance(ctx, _Cast):
            _, grad, wire = ctx
            grad.copy_(tensor)  # the codec's decode (back to the gradient's dtype), into the gradient's storage
            self._free.setdefault((wire.shape, wire.dtype, wire.device), []).append(wire)
            return grad
        return self.codec.decode(self.ops, tensor, ctx)


def _as_list(done) -> list:
    return list(done) if isinstance(done, (list, tuple)) else [done]


class TorchCollectives(Collectives):
    """Horovod's PyTorch calls for :class:`~hvdsync.core.comm.reducer.CodecReducer`'s rounds: the all-reduces in one
    grouped request and the allgathers in another, both in flight before either is waited for; counts recorded
    eagerly, the codec's time by the clock."""

    timed = True

    def __init__(self) -> None:
        self.size, self.rank = hvd.size(), hvd.rank()

    def round(self, index: int, reduce: list, gather: list, average: bool) -> tuple[list, list]:
        name = f"hvdsync.codec.{index}"
        handles = []
        if reduce:
            # One grouped request: Horovod fuses the round's all-reduces into as few transfers as the buffer allows.
            handles.append(hvd.grouped_allreduce_async([t.contiguous() for t in reduce], name=name,
                                                       op=hvd.Average if average else hvd.Sum))
        if gather:
            # The allgathers too in one grouped request (values and indices of every tensor): one negotiation for
            # the round, not one per tensor (8 per step for a 2-layer model's top-k).
            handles.append(hvd.grouped_allgather_async([t.contiguous() for t in gather], name=f"{name}.gather"))
        done = [_as_list(wait(h)) for h in handles]
        return (done.pop(0) if reduce else []), (done.pop(0) if gather else [])

    def record(self, counter: WireCounter, tensors: list) -> None:
        for t in tensors:
            counter.record(t.numel(), t.element_size(), _dtype_name(t.dtype), gradients=0)

    def count_gradients(self, counter: WireCounter, n: int) -> None:
        counter.add_gradients(n)


class CodecReducer(_CoreReducer):
    """:class:`hvdsync.core.comm.reducer.CodecReducer` on torch kernels (:class:`TorchOps` on ``device``) and
    Horovod's PyTorch collectives (:class:`TorchCollectives`); the arguments are the core's, but ``ops`` and
    ``collectives``."""

    def __init__(self, codec: Codec | str, shapes: Sequence[tuple[int, ...]], sync, counter: WireCounter | None = None,
                 seed: int = 0, device: torch.device | str = "cpu", reuse_inputs: bool = False) -> None:
        super().__init__(codec, shapes, sync, TorchOps(device, reuse_inputs), TorchCollectives(), counter, seed)


def take_sgd_momentum(optimizer: torch.optim.Optimizer, codec: Codec, parameters: Sequence) -> list[float] | None:
    """Move ``torch.optim.SGD``'s momentum (and its coupled weight decay, which SGD adds before the momentum) into
    ``codec`` (``sync.momentum_correction``); the optimizer keeps stepping, without them. Returns each parameter's
    weight decay, or ``None`` (nothing moved: not SGD, or no momentum).

    Raises ``ValueError`` naming ``sync.momentum_correction`` where it cannot be right: parameter groups with
    different momentum, or dampening (the codec's velocity has one momentum, undamped, as DGC's).
    """
    if not isinstance(optimizer, torch.optim.SGD) or not any(g["momentum"] for g in optimizer.param_groups):
        return None
    kinds = {(g["momentum"], g["dampening"], g["nesterov"]) for g in optimizer.param_groups}
    if len(kinds) > 1 or next(iter(kinds))[1]:
        raise ValueError(f"sync.momentum_correction: true is not allowed with this optimizer's parameter groups "
                         f"(momentum, dampening, nesterov) = {sorted(kinds)}; it needs one momentum and no "
                         "dampening; or set sync.momentum_correction: false")
    momentum, _, nesterov = next(iter(kinds))
    codec.correct_momentum(momentum, nesterov)
    decay = {id(p): g["weight_decay"] for g in optimizer.param_groups for p in g["params"]}
    for g in optimizer.param_groups:
        g.update(momentum=0.0, nesterov=False, weight_decay=0.0)
    return [decay.get(id(p), 0.0) for p in parameters]


class SkipSynchronize:
    """Horovod's ``skip_synchronize()`` for hvdsync's own optimizers: ``step()`` inside the block does not
    synchronize, because the caller already did (e.g. to unscale or clip the reduced gradients in between)."""

    _skip = False

    @contextlib.contextmanager
    def skip_synchronize(self):
        self._skip = True
        try:
            yield
        finally:
            self._skip = False


class LocalOptimizerView(SkipSynchronize):
    """What hvdsync's distributed optimizers share with ``hvd.DistributedOptimizer``: ``skip_synchronize()``, and
    everything they do not define themselves (``param_groups``, ``state``, ``add_param_group``, ...) is the wrapped
    local optimizer's (``self.optimizer``), so LR schedulers and user code see the optimizer they built."""

    def __getattr__(self, name):
        return getattr(self.__dict__["optimizer"], name)

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state


class CodecOptimizer(LocalOptimizerView):
    """A distributed optimizer for the reducing codecs, with ``hvd.DistributedOptimizer``'s calling convention.

    Gradients add up in ``.grad`` over the backward passes of a step; ``synchronize()`` combines them across ranks
    with the codec; ``step()`` synchronizes (unless inside ``skip_synchronize()``) and steps the local optimizer.
    Everything else (``param_groups``, ``zero_grad``, ``add_param_group``) is the local optimizer's.
    ``state_dict()`` holds the local optimizer's state and, under ``"hvdsync_codec"``, the codec's.

    Args:
        optimizer: the local optimizer; named_parameters: ``model.named_parameters()``.
        sync: the checked :class:`~hvdsync.config.SyncConfig` (op, error feedback, momentum correction).
        codec: the reducing codec built from ``sync.compression`` (:func:`hvdsync.torch.get_codec`).
        counter: records every tensor handed to Horovod; seed: the global seed of the codec's random choices.

    Example:
        >>> sync = Config.from_dict({"sync": {"compression": "topk:0.01"}}).sync                  # doctest: +SKIP
        >>> opt = CodecOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(), sync,
        ...                      get_codec(sync.compression))                                    # doctest: +SKIP
        >>> loss.backward(); opt.step(); opt.zero_grad()                                         # doctest: +SKIP
    """

    def __init__(self, optimizer: torch.optim.Optimizer, named_parameters: Iterable, sync, codec: Codec,
                 counter: WireCounter | None = None, seed: int = 0) -> None:
        self.optimizer = optimizer
        # Sorted by name: every rank lists the same parameters in the same order, whatever order the user passed.
        self.parameters = [p for _, p in sorted(named_parameters, key=lambda kv: kv[0]) if p.requires_grad]
        device = self.parameters[0].device if self.parameters else "cpu"
        # Momentum correction (DGC): the codec accumulates SGD's velocity; the optimizer then steps without momentum.
        self._decay = (take_sgd_momentum(optimizer, codec, self.parameters)
                       if sync.momentum_correction and codec.takes_momentum(sync.error_feedback) else None)
        # reuse_inputs: the gradients handed to the reducer are .grad (or this step's temporaries): a codec may decode
        # into them.
        self.reducer = CodecReducer(codec, [tuple(p.shape) for p in self.parameters], sync, counter, seed, device,
                                    reuse_inputs=True)
        self.counter = self.reducer.counter
        # Set by hvdsync.torch.precision.MixedPrecision under fp16: a callable returning the current loss scale.
        self.loss_scale = None
        self._skip = False

    @torch.no_grad()
    def synchronize(self) -> None:
        """Combine every parameter's ``.grad`` across ranks (a parameter without one contributes zeros: every rank
        must hand over the same list)."""
        # Sparse gradients (nn.Embedding(sparse=True)) are densified: the codecs work on dense tensors (the config
        # allows only sync.sparse dense with these codecs).
        grads = [densify(p.grad) if p.grad is not None else torch.zeros_like(p) for p in self.parameters]
        scale = float(self.loss_scale()) if self.loss_scale is not None else None
        if scale is not None:
            # Under loss scaling a step may overflow. Then the codec must not run (its residuals and Q would take
            # the inf for good): every rank learns whether any rank overflowed and all leave the gradients as they
            # are; the all-reduced decision in MixedPrecision then skips the step everywhere.
            local = torch.tensor([0.0 if all(bool(torch.isfinite(g).all()) for g in grads) else 1.0])
            if hvd.allreduce(local, op=hvd.Max, name="hvdsync.codec.overflow").item() > 0:
                return
            # The codec works on the real gradient, so residuals keep their meaning when the scale changes.
            grads = [g / scale for g in grads]
        if self._decay is not None:
            # SGD's coupled weight decay joins the gradient before the momentum, as in SGD itself (now in the codec).
            grads = [g + p.detach() * wd if wd else g for g, p, wd in zip(grads, self.parameters, self._decay)]
        reduced = self.reducer.reduce(grads)
        if scale is not None:
            reduced = [g * scale for g in reduced]
        for p, g in zip(self.parameters, reduced):
            if p.grad is None or p.grad.is_sparse:
                p.grad = g
            elif g.data_ptr() != p.grad.data_ptr():   # not already decoded into .grad (TorchOps.matmul_into)
                p.grad.copy_(g)

    def step(self, closure=None):
        if not self._skip:
            self.synchronize()
        return self.optimizer.step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {**self.optimizer.state_dict(), "hvdsync_codec": self.reducer.state.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        state = dict(state)
        codec = state.pop("hvdsync_codec", None)
        self.optimizer.load_state_dict(state)
        if codec is not None:
            self.reducer.state.load_state_dict(codec)
