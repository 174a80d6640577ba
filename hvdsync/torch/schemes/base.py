"""What the PyTorch sync-mode optimizers share: the surface of ``hvd.DistributedOptimizer``, byte counts, and
moving flat tensors in and out of parameters."""
from __future__ import annotations

import horovod.torch as hvd
import torch

from hvdsync.core.comm.codecs import WireCounter
from hvdsync.torch.compression import CodecCompressor, SkipSynchronize


def flatten(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The tensors as one 1-D tensor (what one collective moves), in list order."""
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def unflatten_into(flat: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    """Copy consecutive pieces of ``flat`` into ``tensors`` (the inverse of :func:`flatten`), in place."""
    with torch.no_grad():
        offset = 0
        for t in tensors:
            t.copy_(flat[offset:offset + t.numel()].view_as(t))
            offset += t.numel()


def _options(optimizer: torch.optim.Optimizer) -> dict:
    if len(optimizer.param_groups) != 1:
        raise ValueError("optimizer: a sync.mode other than 'allreduce' takes an optimizer with one parameter group "
                         f"(got {len(optimizer.param_groups)})")
    return {k: v for k, v in optimizer.param_groups[0].items() if k != "params"}


def _initialise_state(optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> None:
    # What hvd.broadcast_optimizer_state does to a fresh optimizer: one local step on zero gradients, so state
    # exists (momentum buffers, Adam's step count) exactly as on the all-reduce path.
    for p in params:
        p.grad = torch.zeros_like(p)
    optimizer.step()
    for p in params:
        p.grad = None


class SchemeOptimizer(SkipSynchronize):
    """What the sync-mode optimizers share: the optimizer surface the training step uses, and the byte counts.

    Args:
        optimizer: the user's local optimizer over ``model.parameters()`` (one parameter group).
        model: the model.
        sync: a :class:`~hvdsync.config.SyncConfig`.
        counter: records every tensor handed to Horovod (bytes, dtypes), like the all-reduce path's compressor.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, model: torch.nn.Module, sync,
                 counter: WireCounter | None = None) -> None:
        self.optimizer = optimizer
        self.sync = sync
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.counter = counter if counter is not None else WireCounter()
        self.codec = CodecCompressor(sync.compression, self.counter)
        self.rank, self.size = hvd.rank(), hvd.size()
        self.numel = sum(p.numel() for p in self.params)
        self.sent = 0
        self.received = 0
        self.rounds = 0
        self._synchronized = False
        self._skip = False
        _options(optimizer)

    # ---- the surface of hvd.DistributedOptimizer ------------------------------------------------------------
    @property
    def param_groups(self) -> list[dict]:
        return self.optimizer.param_groups

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def synchronize(self) -> None:
        """Communicate for this step (every rank must call it the same number of times)."""
        if not self._synchronized:
            self._synchronize()
            self._synchronized = True

    def step(self, closure=None):
        if closure is not None:
            raise ValueError("closure: not supported by sync.mode optimizers")
        if not self._skip:
            self.synchronize()
        self._step()
        self._synchronized = False

    @property
    def traffic(self) -> dict:
        """Bytes this rank sent and received through the mode's collectives, and the rounds."""
        return {"sent": self.sent, "received": self.received, "rounds": self.rounds}

    # ---- helpers -----------------------------------------------------------------------------------------------
    def _flat_params(self) -> torch.Tensor:
        return flatten(self.params)

    def _set_params(self, flat: torch.Tensor) -> None:
        unflatten_into(flat, self.params)

    def _synchronize(self) -> None:
        raise NotImplementedError

    def _step(self) -> None:
        raise NotImplementedError
