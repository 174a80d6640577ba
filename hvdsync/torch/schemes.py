"""``sync.mode`` for PyTorch: a parameter server and gossip averaging built from Horovod's collectives.

:func:`hvdsync.torch.distributed_optimizer` looks ``sync.mode`` up in :data:`SCHEMES` and, for any mode but
``allreduce``, returns one of these optimizers instead of Horovod's ``DistributedOptimizer``. They have the same
surface as Horovod's (``zero_grad``, ``synchronize``, ``skip_synchronize``, ``step``, ``param_groups``,
``state_dict``), so the training step, the user's own loop and an LR scheduler work unchanged. The plans (who owns
which shard, who talks to whom, how much) come from :mod:`hvdsync.core.schemes`; this module only moves tensors.

* :class:`ParameterServerOptimizer` (``sync.mode: ps``): ``synchronize`` pushes the gradients to the shard owners
  (``hvd.reducescatter`` when every rank owns a shard, ``hvd.alltoall`` with splits otherwise); ``step`` updates
  the owned shard with the user's optimizer class (its state lives only at the owner) and pulls the parameters back
  (``hvd.allgather``, or ``hvd.broadcast`` from the single server).
* :class:`GossipOptimizer` (``sync.mode: gossip``): every ``sync.period`` steps ``synchronize`` exchanges the
  parameters with the ring neighbours (``hvd.alltoall`` with splits) and mixes them; ``step`` is the local step
  on the local gradient (D-PSGD).
* :class:`LocalSGDOptimizer` (``sync.mode: local_sgd``): ``step`` is the local step; every ``sync.period`` steps it
  then averages the parameters and the optimizer state in one ``hvd.allreduce``; with ``sync.warmup_steps`` the
  first steps all-reduce the gradients instead (post-local SGD).

Both count the bytes each rank sends and receives (:attr:`SchemeOptimizer.traffic`) from the tensors and splits
they hand to Horovod.
"""
from __future__ import annotations


import horovod.torch as hvd
import torch

from hvdsync.core.codecs import WireCounter
from hvdsync.core.ring import chunk_bounds
from hvdsync.core import ring
from hvdsync.core.schemes import gossip, local_sgd
from hvdsync.core.schemes.ps import push_splits, server_count
from hvdsync.torch.compression import CodecCompressor, SkipSynchronize


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
        return torch.cat([p.detach().reshape(-1) for p in self.params])

    def _set_params(self, flat: torch.Tensor) -> None:
        with torch.no_grad():
            offset = 0
            for p in self.params:
                p.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()

    def _synchronize(self) -> None:
        raise NotImplementedError

    def _step(self) -> None:
        raise NotImplementedError


class ParameterServerOptimizer(SchemeOptimizer):
    """``sync.mode: ps``: push gradients to the shard owners, update at the owner, pull the parameters.

    Rank j < k owns the j-th contiguous shard of the flattened parameters (k = ``sync.ps_servers``, 0 = every
    rank) and keeps the optimizer state of that shard only: a new optimizer of the user's class and settings over
    the shard (element-wise optimizers such as SGD, Adam; the LR of the wrapped optimizer is copied in every step,
    so schedulers work).
    """

    def __init__(self, optimizer, model, sync, counter=None) -> None:
        super().__init__(optimizer, model, sync, counter)
        self.servers = server_count(self.size, sync.ps_servers)
        self.splits = push_splits(self.numel, self.size, sync.ps_servers)
        lo, hi = chunk_bounds(self.numel, self.servers)[self.rank] if self.rank < self.servers else (0, 0)
        self.lo, self.hi = lo, hi
        self.shard = torch.nn.Parameter(self._flat_params()[lo:hi].clone())
        self.shard_optimizer = type(optimizer)([self.shard], **_options(optimizer))
        _initialise_state(self.shard_optimizer, [self.shard])
        self._reduced: torch.Tensor | None = None

    def _synchronize(self) -> None:
        pieces, ctx = [], []
        for p in self.params:
            g = p.grad if p.grad is not None else torch.zeros_like(p)
            wire, c = self.codec.compress(g.detach().reshape(-1))
            pieces.append(wire)
            ctx.append(c)
        flat = torch.cat(pieces)
        itemsize = flat.element_size()
        mine = self.splits[self.rank] if self.rank < self.servers else 0
        if self.servers == self.size:
            # Every rank owns a shard: the push is exactly a reduce-scatter (Horovod splits the first dimension like
            # chunk_bounds: the first size % W ranks get one element more).
            reduced = hvd.reducescatter(flat, op=hvd.Sum, name="hvdsync.ps.push")
        else:
            received, _ = hvd.alltoall(flat, splits=torch.tensor(self.splits, dtype=torch.int32),
                                       name="hvdsync.ps.push")
            reduced = received.view(self.size, mine).sum(dim=0) if mine else received[:0]
        self.sent += (flat.numel() - mine) * itemsize
        self.received += (self.size - 1) * mine * itemsize
        reduced = self.codec.decompress(reduced, ctx[0]) if len(ctx) else reduced
        self._reduced = reduced / self.size if self.sync.op == "average" else reduced

    def _step(self) -> None:
        with torch.no_grad():
            # The parameters equal the last pull; re-reading them also picks up a broadcast or a loaded checkpoint.
            self.shard.copy_(self._flat_params()[self.lo:self.hi])
        if self.hi > self.lo:
            self.shard.grad = self._reduced.to(self.shard.dtype)
            # The wrapped optimizer's hyperparameters (a scheduler may have changed the LR) apply at the owner.
            self.shard_optimizer.param_groups[0].update(_options(self.optimizer))
            self.shard_optimizer.step()
        itemsize = self.shard.element_size()
        mine = self.hi - self.lo
        if self.servers == 1:
            source = self.shard.detach() if self.rank == 0 else self._flat_params()
            flat = hvd.broadcast(source, root_rank=0, name="hvdsync.ps.pull")
        else:
            flat = hvd.allgather(self.shard.detach(), name="hvdsync.ps.pull")
        self.sent += (self.size - 1) * mine * itemsize
        self.received += (self.numel - mine) * itemsize
        self._set_params(flat)
        self.rounds += 1


class GossipOptimizer(SchemeOptimizer):
    """``sync.mode: gossip``: every ``sync.period`` steps, mix the parameters with the ring neighbours' (Metropolis
    weights, :func:`hvdsync.core.schemes.gossip.mixing_matrix`), then take the local step on the local gradient.

    With ``track_consensus = True`` it also all-reduces the parameters before and after each mixing to record the
    consensus distance (extra traffic, for measurements only; not counted in :attr:`traffic`).
    """

    def __init__(self, optimizer, model, sync, counter=None) -> None:
        super().__init__(optimizer, model, sync, counter)
        self.neighbours = gossip.neighbours(self.rank, self.size)
        self.weights = gossip.mixing_matrix(self.size)[self.rank]
        self.splits = gossip.exchange_splits(self.numel, self.rank, self.size)
        self.steps = 0
        self.track_consensus = False
        self.consensus: list[tuple[int, float, float]] = []

    def consensus_distance(self) -> float:
        """sqrt(mean over ranks of ||x_r - mean x||^2), through two all-reduces (every rank must call it)."""
        x = self._flat_params().double()
        mean = hvd.allreduce(x, op=hvd.Average, name="hvdsync.gossip.mean")
        sq = hvd.allreduce(((x - mean) ** 2).sum().reshape(1), op=hvd.Average, name="hvdsync.gossip.distance")
        return float(sq.sqrt())

    def _synchronize(self) -> None:
        if self.steps % self.sync.period or not self.neighbours:
            return
        before = self.consensus_distance() if self.track_consensus else None
        x = self._flat_params()
        for p in self.params:
            self.counter.record(p.numel() * len(self.neighbours), p.element_size(), str(p.dtype).replace("torch.", ""))
        outgoing = x.repeat(len(self.neighbours))          # one copy per neighbour, in destination-rank order
        received, _ = hvd.alltoall(outgoing, splits=torch.tensor(self.splits, dtype=torch.int32),
                                   name="hvdsync.gossip.exchange")
        mixed = float(self.weights[self.rank]) * x
        for i, j in enumerate(self.neighbours):             # received chunks come in source-rank order
            mixed = mixed + float(self.weights[j]) * received[i * self.numel:(i + 1) * self.numel]
        self._set_params(mixed)
        nbytes = len(self.neighbours) * self.numel * x.element_size()
        self.sent += nbytes
        self.received += nbytes
        self.rounds += 1
        if before is not None:
            self.consensus.append((self.steps, before, self.consensus_distance()))

    def _step(self) -> None:
        self.optimizer.step()
        self.steps += 1


class LocalSGDOptimizer(SchemeOptimizer):
    """``sync.mode: local_sgd``: local steps, and every ``sync.period`` steps one all-reduce that averages the
    parameters and the optimizer state (:mod:`hvdsync.core.schemes.local_sgd` says when, and why the state too).

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
        flat = torch.cat([t.detach().reshape(-1) for t in tensors])
        for i, t in enumerate(tensors):
            # The state tensors ride in the parameters' round: their bytes count, the round is counted once.
            self.counter.record(t.numel(), t.element_size(), str(t.dtype).replace("torch.", ""),
                                gradients=int(i < len(self.params)))
        nbytes = int(ring.ring_bytes_per_rank(self.size, flat.numel() * flat.element_size()))
        self.sent += nbytes
        self.received += nbytes
        self.rounds += 1
        return hvd.allreduce(flat, op=hvd.Average, name=name)

    @staticmethod
    def _scatter(flat: torch.Tensor, tensors: list[torch.Tensor]) -> None:
        with torch.no_grad():
            offset = 0
            for t in tensors:
                t.copy_(flat[offset:offset + t.numel()].view_as(t))
                offset += t.numel()

    def average(self) -> None:
        """Replace the parameters and optimizer state by their average over ranks (one all-reduce)."""
        tensors = self.params + self._state_tensors()
        self._scatter(self._allreduce_average(tensors, "hvdsync.local_sgd.average"), tensors)
        self.averages += 1

    def _synchronize(self) -> None:
        if not local_sgd.synchronous(self.steps + 1, self.sync.warmup_steps):
            return  # a local step: nothing to wait for
        for p in self.params:
            if p.grad is None:  # a parameter the loss did not touch still joins the all-reduce (as zeros)
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in self.params]
        self._scatter(self._allreduce_average(grads, "hvdsync.local_sgd.gradients"), grads)

    def _step(self) -> None:
        self.optimizer.step()
        self.steps += 1
        if local_sgd.averages_after(self.steps, self.sync.period, self.sync.warmup_steps):
            self.average()


SCHEMES: dict[str, type[SchemeOptimizer]] = {"ps": ParameterServerOptimizer, "gossip": GossipOptimizer,
                                             "local_sgd": LocalSGDOptimizer}


def scheme_optimizer(optimizer: torch.optim.Optimizer, model: torch.nn.Module, sync,
                     counter: WireCounter | None = None) -> SchemeOptimizer:
    """The optimizer for ``sync.mode`` (any mode in :data:`SCHEMES`).

    Example (inside a Horovod worker)::

        opt = scheme_optimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, SyncConfig(mode="ps"))
    """
    if sync.mode == "ps" and not 0 <= sync.ps_servers <= hvd.size():
        raise ValueError(f"sync.ps_servers: {sync.ps_servers!r} is not allowed with {hvd.size()} workers; "
                         f"expected 0 to {hvd.size()}")
    return SCHEMES[sync.mode](optimizer, model, sync, counter)


__all__ = ["SCHEMES", "scheme_optimizer", "SchemeOptimizer", "ParameterServerOptimizer", "GossipOptimizer",
           "LocalSGDOptimizer"]


def train_modes(cfg_dict: dict, modes: dict[str, dict], track_consensus: bool = True,
                trace: bool = False) -> dict[str, dict]:
    """Train the same model from the same start once per entry of ``modes`` (name -> ``sync`` overrides) in this
    worker; every rank calls it (e.g. through :func:`hvdsync.launch.run`). For notebooks and tests that compare
    sync modes side by side on one pair of workers; what it returns: :func:`hvdsync.core.schemes.compare.train_modes`.

    Example::

        out = launch.run(train_modes, args=(cfg.to_dict(), {"ring": {}, "ps": {"mode": "ps"}}), np=2)[0]
    """
    from hvdsync.core.schemes import compare
    from hvdsync.torch.runtime import init
    from hvdsync.torch.train import build

    def prepare(opt) -> None:
        if isinstance(opt, GossipOptimizer):
            opt.track_consensus = track_consensus

    return compare.train_modes(cfg_dict, modes, init, build, torch.manual_seed, prepare, trace)
