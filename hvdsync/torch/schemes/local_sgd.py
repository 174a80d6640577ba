"""``sync.mode: local_sgd`` for PyTorch: local steps, then parameters and optimizer state averaged."""
from __future__ import annotations

import horovod.torch as hvd
import torch

from hvdsync.core.comm import traffic
from hvdsync.core.comm.schemes import local_sgd
from hvdsync.torch.schemes.base import SchemeOptimizer, flatten, unflatten_into
from hvdsync.torch.sparse import densify


class LocalSGDOptimizer(SchemeOptimizer):
    """``sync.mode: local_sgd``: local steps, and every ``sync.period`` steps one all-reduce that averages the
    parameters and the optimizer state (:mod:`hvdsync.core.comm.schemes.local_sgd` says when, and why the state too).

    ``rounds`` counts the all-reduces it issues (gradient rounds of the synchronous warm-up, then averagings);
    :meth:`average` is public so a loop can make the ranks agree at a point of its choosing (e.g. before saving
    or evaluating when the last step was not an averaging step); every rank must call it.
    """

    def __init__(self, optimizer, model, sync, counter=None) -> None:
        super().__init__(optimizer, model, sync, counter)
        self.steps = 0
        self.averages = 0

    def _state_tensors(self) -> list[torch.Tensor]:
        # Floating-point state of a parameter's shape (momentum, Adam's moments), in parameter order and by key,
        # so every rank lists the same tensors in the same order; scalars (Adam's step) agree on every rank anyway.
        found = []
        for p in self.params:
            state = self.optimizer.state.get(p, {})
            found += [state[k] for k in sorted(state) if isinstance(state[k], torch.Tensor)
                      and state[k].is_floating_point() and state[k].shape == p.shape]
        return found

    def _allreduce_average(self, tensors: list[torch.Tensor], name: str) -> torch.Tensor:
        flat = flatten(tensors)
        for i, t in enumerate(tensors):
            # The state tensors ride in the parameters' round: their bytes count, the round is counted once.
            self.counter.record(t.numel(), t.element_size(), str(t.dtype).replace("torch.", ""),
                                gradients=int(i < len(self.params)))
        nbytes = int(traffic.ring_bytes_per_rank(self.size, flat.numel() * flat.element_size()))
        self.sent += nbytes
        self.received += nbytes
        self.rounds += 1
        # In place: flat is this call's own concatenation, so Horovod need not allocate (and page-fault in) a second
        # buffer of the model's size and copy into it (docs/measurements/allreduce.md, "Where the time goes").
        return hvd.allreduce_(flat, op=hvd.Average, name=name)

    def state_dict(self) -> dict:
        # The step count places a resumed run on the schedule (warm-up done or not, when the next averaging is).
        return {**self.optimizer.state_dict(), "hvdsync_local_sgd": {"steps": self.steps}}

    def load_state_dict(self, state: dict) -> None:
        state = dict(state)
        own = state.pop("hvdsync_local_sgd", None)
        if own is not None:
            self.steps = int(own["steps"])
        self.optimizer.load_state_dict(state)

    def average(self) -> None:
        """Replace the parameters and optimizer state by their average over ranks (one all-reduce)."""
        tensors = self.params + self._state_tensors()
        unflatten_into(self._allreduce_average(tensors, "hvdsync.local_sgd.average"), tensors)
        self.averages += 1

    def _synchronize(self) -> None:
        if not local_sgd.synchronous(self.steps + 1, self.sync.warmup_steps):
            return  # a local step: nothing to wait for
        for p in self.params:
            if p.grad is None:  # a parameter the loss did not touch still joins the all-reduce (as zeros)
                p.grad = torch.zeros_like(p)
            p.grad = densify(p.grad)  # an embedding's sparse gradient is all-reduced as the table (sync.sparse dense)
        grads = [p.grad for p in self.params]
        unflatten_into(self._allreduce_average(grads, "hvdsync.local_sgd.gradients"), grads)

    def _step(self) -> None:
        self.optimizer.step()
        self.steps += 1
        if local_sgd.averages_after(self.steps, self.sync.period, self.sync.warmup_steps):
            self.average()
