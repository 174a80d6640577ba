"""Mixed precision for PyTorch on Horovod: ``autocast`` + ``GradScaler``, with the skip decided by all ranks.

The order with a Horovod-style optimizer (``hvd.DistributedOptimizer`` or :class:`CodecOptimizer`)::

    scaler.scale(loss).backward()            # Horovod's hooks start all-reducing the scaled gradients
    optimizer.synchronize()                  # wait for them (or run the codec); then MixedPrecision.step:
    overflow = allreduce(max, local inf/nan) # *every* rank learns whether *any* rank overflowed
    scaler.unscale_(optimizer)               # GradScaler's own inf check ...
    with optimizer.skip_synchronize():
        scaler.step(optimizer)               # ... skips the step on every rank if any rank overflowed
    scaler.update()                          # and lowers the scale on every rank

GradScaler decides from this rank's gradients alone. After an all-reduce of plain gradients an inf usually
reaches every rank anyway, but not always (a codec may drop it, a rank may check before reducing), and a rank that
steps while another skips leaves the two with different models for the rest of the run. So the decision is
all-reduced, and a rank that did not overflow itself marks one gradient entry inf so GradScaler skips too.
"""
from __future__ import annotations

import contextlib

import horovod.torch as hvd
import torch

from hvdsync.core.train.precision import policy

_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


class MixedPrecision:
    """Autocast, loss scaling and the rank-consistent skip for one model and optimizer.

    Args:
        precision: ``train.precision``: ``fp32`` (everything off), ``fp16`` (autocast + dynamic loss scale),
            ``bf16`` (autocast, no loss scale).
        device: where the model runs (autocast and GradScaler are per device type).

    Example:
        >>> mp = MixedPrecision("fp16", torch.device("cpu"))                       # doctest: +SKIP
        >>> with mp.autocast(): loss = loss_fn(model(x), y)                         # doctest: +SKIP
        >>> mp.attach(optimizer)                                                    # doctest: +SKIP
        >>> mp.backward(loss); optimizer.synchronize(); stepped = mp.step(optimizer)  # doctest: +SKIP
    """

    def __init__(self, precision: str, device: torch.device) -> None:
        self.policy = policy(precision)
        self.device_type = torch.device(device).type
        self.scaler = torch.amp.GradScaler(self.device_type, enabled=self.policy.loss_scaling)
        self.skipped_steps = 0

    def autocast(self):
        """The forward pass (and loss) in the compute dtype; a no-op for fp32."""
        if self.policy.compute_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=_DTYPES[self.policy.compute_dtype])

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of the (scaled, for fp16) loss."""
        self.scaler.scale(loss).backward()

    @property
    def scale(self) -> float:
        """The current loss scale (1.0 without loss scaling)."""
        return float(self.scaler.get_scale()) if self.scaler.is_enabled() else 1.0

    def attach(self, optimizer) -> None:
        """Hand a :class:`~hvdsync.torch.compression.CodecOptimizer` the loss scale, so that its codec skips
        overflowed steps and keeps its error-feedback residuals in the units of the real gradient."""
        if self.scaler.is_enabled() and hasattr(optimizer, "loss_scale"):
            optimizer.loss_scale = self.scaler.get_scale

    def step(self, optimizer) -> bool:
        """After ``optimizer.synchronize()``: step unless any rank overflowed; returns whether the step was taken
        (the same answer on every rank)."""
        if not self.scaler.is_enabled():
            with optimizer.skip_synchronize():
                optimizer.step()
            return True
        grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        local = not bool(torch.stack([torch.isfinite(g).all() for g in grads]).all()) if grads else False
        overflow = hvd.allreduce(torch.tensor([float(local)]), op=hvd.Max, name="hvdsync.precision.overflow")
        overflow = bool(overflow.item() > 0)
        if overflow and not local and grads:
            # Another rank overflowed: make GradScaler's own check (this rank's gradients only) see it too.
            grads[0].view(-1)[0] = float("inf")
        self.scaler.unscale_(optimizer)
        with optimizer.skip_synchronize():
            self.scaler.step(optimizer)
        self.scaler.update()
        self.skipped_steps += int(overflow)
        return not overflow

    def state_dict(self) -> dict:
        return {"scaler": self.scaler.state_dict(), "skipped_steps": self.skipped_steps}

    def load_state_dict(self, state: dict) -> None:
        self.scaler.load_state_dict(state["scaler"])
        self.skipped_steps = int(state.get("skipped_steps", 0))
