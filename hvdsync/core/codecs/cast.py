"""Cast codecs: the gradient keeps its shape and changes dtype (``none``, ``fp16``, ``bf16``).

They go through Horovod's own ``compression=`` interface, so PyTorch keeps Horovod's asynchronous all-reduce from
the backward hooks. fp16 has 10 mantissa bits and a range up to 65,504; bf16 has 7 mantissa bits and float32's
range (notebook 09 plots both): bf16 rounds more coarsely but never overflows where float32 does not.
"""
from __future__ import annotations

from hvdsync.core.codecs.base import Codec


class Cast(Codec):
    """Send floating-point gradients as ``wire_dtype`` (``None``: as they are)."""

    cast = True

    def __init__(self, name: str, wire_dtype: str | None) -> None:
        self.name = name
        self.wire_dtype = wire_dtype

    def __repr__(self) -> str:
        return f"Cast({self.name!r}, {self.wire_dtype!r})"
