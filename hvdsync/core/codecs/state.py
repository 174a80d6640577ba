"""The codecs' per-parameter state (residuals, step counters, PowerSGD's Q), and how it is saved.

The state lives in *slots* that the adapter's :class:`~hvdsync.core.codecs.base.Ops` makes (torch tensors,
tf.Variables, numpy arrays), so that it persists between steps in each framework's own way (a TensorFlow graph
can only carry state in variables). :meth:`CodecState.state_dict` / :meth:`CodecState.load_state_dict` move it in
and out as plain numpy arrays, which is what checkpoints and elastic commits store next to the optimizer state::

    saved = reducer.state.state_dict()     # {"codec": "topk:0.01", "params": [{"residual": array, ...}, ...]}
    reducer.state.load_state_dict(saved)   # same codec and shapes, any framework
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from hvdsync.core.codecs.base import Codec, Ops


class CodecState:
    """One dict of slots per parameter, in the order the adapter lists its parameters (the same on every rank).

    Args:
        codec: the codec whose :meth:`~hvdsync.core.codecs.base.Codec.slots` says what each parameter keeps.
        shapes: the parameters' shapes.
        ops: makes, reads and writes the slots.
        seed: the global seed (PowerSGD's first Q is drawn from it: the same on every rank).
    """

    def __init__(self, codec: Codec, shapes: Sequence[tuple[int, ...]], ops: Ops, seed: int = 0) -> None:
        self.codec, self.ops = codec, ops
        self.shapes = [tuple(int(d) for d in s) for s in shapes]
        self.slots: list[dict[str, Any]] = [
            {name: ops.slot(value) for name, value in codec.slots(shape, i, seed).items()}
            for i, shape in enumerate(self.shapes)]

    def state_dict(self) -> dict:
        """``{"codec": spec, "params": [{slot name: numpy array}, ...]}`` (copies)."""
        return {"codec": self.codec.spec,
                "params": [{name: np.array(self.ops.to_numpy(s)) for name, s in slots.items()}
                           for slots in self.slots]}

    def load_state_dict(self, saved: dict) -> None:
        """Restore what :meth:`state_dict` returned; the codec and the parameter shapes must match."""
        if saved.get("codec") != self.codec.spec:
            raise ValueError(f"codec state: saved for {saved.get('codec')!r}, this run uses {self.codec.spec!r}")
        params = saved["params"]
        if len(params) != len(self.slots):
            raise ValueError(f"codec state: saved for {len(params)} parameters, this model has {len(self.slots)}")
        for i, (slots, values) in enumerate(zip(self.slots, params)):
            if set(slots) != set(values):
                raise ValueError(f"codec state: parameter {i} has slots {sorted(slots)}, saved {sorted(values)}")
            for name, slot in slots.items():
                value = np.asarray(values[name])
                if value.shape != tuple(self.ops.to_numpy(slot).shape):
                    raise ValueError(f"codec state: parameter {i} slot {name!r} has shape "
                                     f"{self.ops.to_numpy(slot).shape}, saved {value.shape}")
                self.ops.assign(slot, value)
