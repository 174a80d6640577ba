"""Gradient codecs: what a gradient looks like on the wire.

A codec is numpy-level maths (``encode``/``decode``) plus the facts the adapters need to build a Horovod
compressor (the wire dtype). Both adapters look codecs up here by name, so ``sync.compression: fp16`` means the
same thing in PyTorch and TensorFlow, and the bytes each puts on the wire are counted the same way
(:class:`WireCounter`).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Codec:
    """A cast-style codec.

    Attributes:
        name: the config name.
        wire_dtype: numpy dtype name on the wire, or None to send the gradient as it is.
    """

    name: str
    wire_dtype: str | None

    def applies_to(self, dtype_name: str) -> bool:
        """Only floating-point gradients are cast; integer tensors travel unchanged."""
        return self.wire_dtype is not None and dtype_name.startswith(("float", "bfloat")) and dtype_name != self.wire_dtype

    def encode(self, x: np.ndarray) -> np.ndarray:
        return x.astype(self.wire_dtype) if self.applies_to(x.dtype.name) else x

    def decode(self, y: np.ndarray, dtype: np.dtype) -> np.ndarray:
        return y.astype(dtype)

    def wire_bytes(self, numel: int, itemsize: int) -> int:
        """Bytes one rank hands to the allreduce for a tensor of ``numel`` elements of ``itemsize`` bytes."""
        if self.wire_dtype is None:
            return numel * itemsize
        return numel * np.dtype(self.wire_dtype).itemsize


CODECS: dict[str, Codec] = {
    "none": Codec("none", None),
    "fp16": Codec("fp16", "float16"),
}


def get_codec(name: str) -> Codec:
    try:
        return CODECS[name]
    except KeyError:
        raise ValueError(f"compression: {name!r} is not allowed; choose one of: {', '.join(CODECS)}") from None


@dataclass
class WireCounter:
    """Counts what an adapter's compressor hands to Horovod: tensors, bytes, dtypes.

    The compressor runs once per tensor per allreduce, so ``tensors`` divided by the number of gradient tensors
    is the number of allreduce rounds: with ``accumulate=k`` it grows once per k backward passes.
    """

    tensors: int = 0
    bytes: int = 0
    dtypes: set = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def record(self, numel: int, itemsize: int, dtype_name: str) -> None:
        with self._lock:
            self.tensors += 1
            self.bytes += numel * itemsize
            self.dtypes.add(dtype_name)

    def snapshot(self) -> dict:
        with self._lock:
            return {"tensors": self.tensors, "bytes": self.bytes, "dtypes": sorted(self.dtypes)}

    def reset(self) -> None:
        with self._lock:
            self.tensors = 0
            self.bytes = 0
            self.dtypes = set()
