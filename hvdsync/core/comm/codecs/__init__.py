"""Gradient codecs: what a gradient looks like on the wire, written once for both frameworks.

``sync.compression`` names one (``name`` or ``name:param``):

=================  ================================================================  ===================================
codec              what travels per gradient of n float32 values (bytes per rank)     module
=================  ================================================================  ===================================
``none``           n float32 (4n), all-reduce                                          :mod:`~hvdsync.core.comm.codecs.cast`
``fp16``           n float16 (2n), all-reduce                                          :mod:`~hvdsync.core.comm.codecs.cast`
``bf16``           n bfloat16 bit patterns (2n), allgather, summed in float32          :mod:`~hvdsync.core.comm.codecs.cast`
``topk:<ratio>``   k = floor(ratio n) values + int32 indices (8k), allgather            :mod:`~hvdsync.core.comm.codecs.sparse`
``randk:<ratio>``  k values at positions every rank draws alike (4k), all-reduce        :mod:`~hvdsync.core.comm.codecs.sparse`
``int8``           n int8 + one float32 scale (n + 4), allgather                        :mod:`~hvdsync.core.comm.codecs.quantize`
``powersgd:<r>``   r (rows + cols) float32 per matrix, two all-reduces                  :mod:`~hvdsync.core.comm.codecs.powersgd`
=================  ================================================================  ===================================

The maths is written against :class:`~hvdsync.core.comm.codecs.base.Ops` (kernels each adapter implements), the
per-parameter state is a :class:`~hvdsync.core.comm.codecs.state.CodecState` (saved with ``state_dict()``), and
:func:`~hvdsync.core.comm.codecs.driver.reduce_all` runs a codec over all parameters in rounds of collectives.
"""
from hvdsync.core._moved import to_adapters
from hvdsync.core.comm.codecs.base import Allgather, Allreduce, Ops, ReduceContext, WireCounter, mix_seed, numel
from hvdsync.core.comm.codecs.driver import reduce_all
from hvdsync.core.comm.codecs.registry import CODECS, choices, register_codec
from hvdsync.core.comm.codecs.state import codec_state_of

__all__ = ["Allgather", "Allreduce", "CODECS", "Ops", "ReduceContext", "WireCounter", "choices", "codec_state_of",
           "mix_seed", "numel", "reduce_all", "register_codec"]

# get_codec, Codec and CodecState are the adapters' public names (hvdsync.torch.get_codec, ...): taken from this
# package they warn, naming the adapter, until 0.4.0. hvdsync imports them from the modules that define them
# (registry, base, state), which do not warn.
__getattr__ = to_adapters(__name__, {"get_codec": "hvdsync.core.comm.codecs.registry",
                                     "Codec": "hvdsync.core.comm.codecs.base",
                                     "CodecState": "hvdsync.core.comm.codecs.state"}, until="0.4.0")
