"""The codecs' per-parameter state (residuals, step counters, PowerSGD's Q), and how it is saved.

The state lives in *slots* that the adapter's :class:`~hvdsync.core.comm.codecs.base.Ops` makes (torch tensors,
tf.Variables, numpy arrays), so that it persists between steps in each framework's own way (a TensorFlow graph
can only carry state in variables). :meth:`CodecState.state_dict` / :meth:`CodecState.load_state_dict` move it in
and out as plain numpy arrays, which is what checkpoints and elastic commits store next to the optimizer state::

    saved = reducer.state.state_dict()     # {"codec": "topk:0.01", "0.residual": array, "0.step": array, ...}
    reducer.state.load_state_dict(saved)   # same codec and shapes, any framework

The dict is flat (``"<parameter index>.<slot name>"`` -> array, plus ``"codec"``), so it goes into ``np.savez``,
``torch.save`` or an elastic commit as it is.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from hvdsync.core.comm.codecs.base import Codec, Ops


class CodecState:
    """One dict of slots per parameter, in the order the adapter lists its parameters (the same on every rank).

    Args:
        codec: the codec whose :meth:`~hvdsync.core.comm.codecs.base.Codec.slots` says what each parameter keeps.
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
        """``{"codec": spec, "<i>.<slot>": numpy array, ...}`` (copies)."""
        out = {"codec": self.codec.spec}
        for i, slots in enumerate(self.slots):
            out.update({f"{i}.{name}": np.array(self.ops.to_numpy(s)) for name, s in slots.items()})
        return out

    def load_state_dict(self, saved: dict) -> None:
        """Restore what :meth:`state_dict` returned; the codec and the parameter shapes must match."""
        codec = str(np.asarray(saved.get("codec")))
        if codec != self.codec.spec:
            raise ValueError(f"codec state: saved for {codec!r}, this run uses {self.codec.spec!r}")
        mine = {f"{i}.{name}" for i, slots in enumerate(self.slots) for name in slots}
        theirs = set(saved) - {"codec"}
        if mine != theirs:
            raise ValueError(f"codec state: saved slots {sorted(theirs)[:6]}... do not match this model's "
                             f"{sorted(mine)[:6]}...")
        for i, slots in enumerate(self.slots):
            for name, slot in slots.items():
                value = np.asarray(saved[f"{i}.{name}"])
                if value.shape != tuple(self.ops.to_numpy(slot).shape):
                    raise ValueError(f"codec state: parameter {i} slot {name!r} has shape "
                                     f"{self.ops.to_numpy(slot).shape}, saved {value.shape}")
                self.ops.assign(slot, value)


def codec_state_of(optimizer: Any) -> CodecState | None:
    """The :class:`CodecState` behind an hvdsync distributed optimizer of either framework (its ``reducer.state``),
    or ``None`` when its codec keeps no state (``none``, ``fp16``). What elastic commits and checkpoints save."""
    return getattr(getattr(optimizer, "reducer", None), "state", None)
