"""What every codec shares: the kernel interface (:class:`Ops`), the requests a codec makes of Horovod, the
codec base class, and the byte counter.

A codec's maths is written once, here in the core, against :class:`Ops`: a dozen array kernels (cast, top-k,
scatter-add, matmul, ...) that each framework adapter implements on its own tensors (``hvdsync/torch/compression.py``,
``hvdsync/tensorflow/compression.py``) and :class:`hvdlab.codecs_numpy.NumpyOps` implements on numpy
arrays (the reference the tests compare the framework kernels with). Arithmetic operators (``+ - * /``) are used
directly: numpy arrays, torch tensors and TensorFlow tensors all support them.

A codec never calls Horovod. Its :meth:`Codec.reduce` is a generator that *yields* the collectives it needs
(:class:`Allreduce`, :class:`Allgather`) and receives their results; :func:`hvdsync.core.comm.codecs.driver.reduce_all`
runs all parameters' generators in lock-step rounds and hands each round's requests to the adapter in one batch.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Generator, Protocol, Sequence

import numpy as np

Tensor = Any  # a numpy array, a torch tensor or a TensorFlow tensor, depending on the Ops in use


class Ops(Protocol):
    """The kernels a codec's maths is written in; one implementation per framework (and numpy)."""

    def dtype_name(self, x: Tensor) -> str: ...               # "float32", "float16", "bfloat16", "int8", ...
    def shape(self, x: Tensor) -> tuple[int, ...]: ...        # static shape
    def cast(self, x: Tensor, dtype: str) -> Tensor: ...
    def bitcast(self, x: Tensor, dtype: str) -> Tensor: ...  # the same bits as another dtype of the same size
    def reshape(self, x: Tensor, shape: Sequence[int]) -> Tensor: ...
    def abs(self, x: Tensor) -> Tensor: ...
    def floor(self, x: Tensor) -> Tensor: ...
    def max(self, x: Tensor) -> Tensor: ...                   # of all elements, shape (1,)
    def maximum(self, x: Tensor, floor: float) -> Tensor: ...
    def clip(self, x: Tensor, low: float, high: float) -> Tensor: ...
    def sqrt(self, x: Tensor) -> Tensor: ...
    def sum(self, x: Tensor, axis: int | None = None) -> Tensor: ...
    def matmul(self, a: Tensor, b: Tensor) -> Tensor: ...
    # a @ b, which the adapter may write into ``out``'s memory (a gradient handed to the codec, no longer read):
    # PyTorch's optimizer does, so a decoded gradient needs neither a new tensor nor a copy back into ``.grad``.
    def matmul_into(self, out: Tensor, a: Tensor, b: Tensor) -> Tensor: ...
    def transpose(self, a: Tensor) -> Tensor: ...             # of a matrix
    def concat(self, xs: Sequence[Tensor], axis: int) -> Tensor: ...
    def topk_indices(self, x: Tensor, k: int) -> Tensor: ...  # int32 indices of the k largest values of a vector
    def take(self, x: Tensor, idx: Tensor) -> Tensor: ...
    def scatter_add(self, n: int, idx: Tensor, values: Tensor) -> Tensor: ...  # zeros(n) with values added at idx
    def uniform(self, n: int, seed: int, step: Tensor) -> Tensor: ...          # float32 U[0, 1), seeded by both
    def all_finite(self, xs: Sequence[Tensor]) -> Tensor: ...  # a boolean scalar
    # State: a "slot" is whatever holds a value between steps (an array, a tensor, a tf.Variable).
    def slot(self, value: np.ndarray) -> Any: ...
    def read(self, slot: Any) -> Tensor: ...
    def assign(self, slot: Any, value: Tensor) -> None: ...
    # In place where the framework allows (torch): the residuals are the size of the gradients, and a new tensor
    # plus a copy back per step cost a PyTorch PowerSGD step 40 % of its encoding (docs/measurements/link.md). The
    # value returned by add_into may share the slot's memory: a codec reads it only until its next change of the slot.
    def add_into(self, slot: Any, x: Tensor) -> Tensor: ...   # slot += x (same shape); the new value
    def sub_into(self, slot: Any, x: Tensor) -> None: ...     # slot -= x (same shape)
    def zero_at(self, slot: Any, idx: Tensor) -> None: ...    # the slot's entries at flat indices idx set to 0
    def to_numpy(self, x: Any) -> np.ndarray: ...
    def from_numpy(self, a: np.ndarray) -> Tensor: ...


@dataclass(frozen=True)
class Allreduce:
    """Ask for ``tensor`` combined across ranks with the configured op (average or sum): same shape on every rank."""

    tensor: Tensor


@dataclass(frozen=True)
class Allgather:
    """Ask for every rank's ``tensor`` concatenated along the first axis, in rank order."""

    tensor: Tensor


Request = Allreduce | Allgather


@dataclass(frozen=True)
class ReduceContext:
    """What a codec's :meth:`Codec.reduce` needs to know about the job.

    Args:
        size: number of ranks.
        average: the configured op is ``average`` (decoders that sum gathered pieces divide by ``size``).
        error_feedback: keep what was not sent and add it to the next gradient.
        seed: the global seed; with the parameter's index it seeds every random choice.
        rank: this rank (per-rank randomness, e.g. stochastic rounding noise).
    """

    size: int
    average: bool = True
    error_feedback: bool = True
    seed: int = 0
    rank: int = 0


Reduction = Generator[list, list, Tensor]


class Codec:
    """A gradient codec. Subclasses set ``name`` and implement either the cast interface or :meth:`reduce`.

    *Cast* codecs (``none``, ``fp16``, ``bf16``) change only the dtype: the gradient keeps its shape, so it goes
    through Horovod's ``compression=`` interface and its asynchronous all-reduce (:meth:`encode`/:meth:`decode`).
    The others (top-k, rand-k, int8, PowerSGD) change what travels (fewer values, indices, factors); they run
    :meth:`reduce` after the backward pass.
    """

    name: str = ""
    cast: bool = False
    wire_dtype: str | None = None
    param: float | int | None = None
    # Rounds of collectives per step (each waits for its own Horovod negotiation): what :meth:`reduce` yields in turn.
    rounds: int = 1

    @property
    def spec(self) -> str:
        """The config value that names this codec: ``"topk:0.01"``."""
        return self.name if self.param is None else f"{self.name}:{self.param:g}"

    # ---- cast codecs --------------------------------------------------------------------------------------------
    def applies_to(self, dtype_name: str) -> bool:
        """Only floating-point gradients are cast; integer tensors travel unchanged."""
        return (self.wire_dtype is not None and dtype_name.startswith(("float", "bfloat"))
                and dtype_name != self.wire_dtype)

    def encode(self, ops: Ops, x: Tensor) -> Tensor:
        """What is handed to the all-reduce for ``x`` (cast codecs)."""
        return ops.cast(x, self.wire_dtype) if self.applies_to(ops.dtype_name(x)) else x

    def decode(self, ops: Ops, y: Tensor, dtype: str) -> Tensor:
        """The all-reduced wire tensor back in the gradient's dtype (cast codecs)."""
        return y if ops.dtype_name(y) == dtype else ops.cast(y, dtype)

    # ---- reducing codecs ----------------------------------------------------------------------------------------
    def slots(self, shape: tuple[int, ...], index: int, seed: int) -> dict[str, np.ndarray]:
        """The initial per-parameter state (residual, step counter, PowerSGD's Q), as numpy arrays."""
        return {}

    def reduce(self, ops: Ops, grad: Tensor, state: dict, ctx: ReduceContext, index: int) -> Reduction:
        """Generator: yields lists of :data:`Request`, receives their results, returns the combined dense gradient
        (same shape and dtype as ``grad``, identical on every rank). ``state`` maps slot names to slots."""
        raise NotImplementedError
        yield  # pragma: no cover

    def takes_momentum(self, error_feedback: bool) -> bool:
        """Whether this codec accumulates SGD's momentum itself (``sync.momentum_correction``; DGC's momentum
        correction for the sparsifiers, :mod:`hvdsync.core.comm.codecs.sparse`); then :meth:`correct_momentum` gets it."""
        return False

    def correct_momentum(self, momentum: float, nesterov: bool = False) -> None:
        raise NotImplementedError(f"{self.spec} does not take the optimizer's momentum")

    def wire_bytes(self, shape: tuple[int, ...], itemsize: int) -> int:
        """Bytes one rank hands to Horovod for one gradient of ``shape`` per reduction (values and indices)."""
        numel = int(np.prod(shape))
        if self.wire_dtype is None:
            return numel * itemsize
        return numel * _itemsize(self.wire_dtype)


def _itemsize(dtype: str) -> int:
    return 2 if dtype == "bfloat16" else np.dtype(dtype).itemsize


def numel(shape: Sequence[int]) -> int:
    return int(np.prod(shape, dtype=np.int64))


def mix_seed(*parts: int) -> int:
    """One 31-bit seed from several integers (global seed, parameter index, rank): distinct parts, distinct seeds."""
    return int(np.random.SeedSequence([int(p) & 0xFFFFFFFF for p in parts]).generate_state(1)[0] & 0x7FFFFFFF)


@dataclass
class WireCounter:
    """Counts what an adapter hands to Horovod for gradients: tensors, bytes, dtypes.

    ``tensors`` counts gradient tensors per round, so divided by the number of gradient tensors it is the number of
    all-reduce rounds. Cast codecs hand over one tensor per gradient; the other codecs hand over pieces (values *and*
    indices, scales, PowerSGD's factors), each one's bytes recorded, so ``bytes`` is everything that went to Horovod.
    """

    tensors: int = 0
    bytes: int = 0
    dtypes: set = field(default_factory=set)
    # Seconds the codec's own kernels took (encode, decode, residuals), not waiting for collectives; added by the
    # eager adapters (PyTorch's). TensorFlow's codecs run inside a compiled step, where Python cannot time them. On a
    # GPU it is the kernels' launch, not their run (CUDA is asynchronous): a CPU figure, for the link benchmark.
    codec_seconds: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def record(self, numel: int, itemsize: int, dtype_name: str, gradients: int = 1) -> None:
        """Count one tensor handed to Horovod; ``gradients``: how many gradient tensors it stands for (0 for the
        second and later pieces of one gradient, so ``tensors`` still counts gradients per round)."""
        with self._lock:
            self.tensors += gradients
            self.bytes += numel * itemsize
            self.dtypes.add(dtype_name)

    def add_gradients(self, n: int) -> None:
        """Count ``n`` gradient tensors reduced in pieces (whose bytes were recorded with ``gradients=0``)."""
        with self._lock:
            self.tensors += n

    def add_codec_time(self, seconds: float) -> None:
        with self._lock:
            self.codec_seconds += seconds

    def snapshot(self) -> dict:
        with self._lock:
            return {"tensors": self.tensors, "bytes": self.bytes, "dtypes": sorted(self.dtypes),
                    "codec_seconds": self.codec_seconds}

    def reset(self) -> None:
        with self._lock:
            self.tensors = 0
            self.bytes = 0
            self.dtypes = set()
            self.codec_seconds = 0.0
