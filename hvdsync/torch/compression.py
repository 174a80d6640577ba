"""Horovod compressor for PyTorch built from a core codec (:mod:`hvdsync.core.codecs`).

Horovod calls ``compress`` on every gradient right before handing it to the all-reduce and ``decompress`` on the
result, so what ``compress`` returns is exactly what travels; the :class:`~hvdsync.core.codecs.WireCounter` records
it (bytes and dtype), which is how the tests show that fp16 gradients really are fp16 on the wire.
"""
from __future__ import annotations

import torch

from hvdsync.core.codecs import Codec, WireCounter, get_codec

_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


class CodecCompressor:
    """Casts floating-point gradients to the codec's wire dtype and back; counts what it hands over."""

    def __init__(self, codec: Codec | str, counter: WireCounter | None = None) -> None:
        self.codec = get_codec(codec) if isinstance(codec, str) else codec
        self.counter = counter if counter is not None else WireCounter()

    def compress(self, tensor: torch.Tensor):
        ctx = tensor.dtype
        if self.codec.applies_to(_dtype_name(tensor.dtype)):
            tensor = tensor.to(_DTYPES[self.codec.wire_dtype])
        self.counter.record(tensor.numel(), tensor.element_size(), _dtype_name(tensor.dtype))
        return tensor, ctx

    def decompress(self, tensor: torch.Tensor, ctx):
        return tensor if tensor.dtype == ctx else tensor.to(ctx)
