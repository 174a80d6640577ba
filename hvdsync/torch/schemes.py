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

import copy

import horovod.torch as hvd
import numpy as np
import torch

from hvdsync.core.codecs import WireCounter
from hvdsync.core.ring import chunk_bounds
from hvdsync.core import ring
from hvdsync.core.schemes import gossip, local_sgd
from hvdsync.core.schemes.ps import push_splits, server_count
from hvdsync.torch.compression import CodecCompressor, SkipSynchronize
from hvdsync.torch.sparse import densify


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

    Saving and restoring that state (checkpoints, elastic commits) works as torch's ``ZeroRedundancyOptimizer``:
    :meth:`consolidate_state_dict` (a collective: every rank calls it) gathers every owner's shard into the full
    state, which :meth:`state_dict` then returns in the wrapped optimizer's own format (per parameter, shaped like
    it: a plain ``torch.optim.SGD`` loads it, and a PS run loads a plain run's). :meth:`load_state_dict` takes
    such a full state on every rank and cuts this rank's shard out of it, for the shard layout of the world at the
    next step, so a state saved with W workers (or k servers) resumes with any other number.
    """

    def __init__(self, optimizer, model, sync, counter=None) -> None:
        super().__init__(optimizer, model, sync, counter)
        # Where each of the wrapped optimizer's parameters (its state dict's index) sits in the flat vector.
        offsets = np.cumsum([0] + [p.numel() for p in self.params])
        position = {id(p): i for i, p in enumerate(self.params)}
        self._layout = [(index, offsets[position[id(p)]], p) for index, p in
                        enumerate(optimizer.param_groups[0]["params"]) if id(p) in position]
        self._full: dict | None = None  # the full state, while it is current (loaded, or gathered since the step)
        self._loaded: dict | None = None  # the full state this rank's shard optimizer holds its piece of
        self._reduced: torch.Tensor | None = None
        self._plan()

    # ---- shard ownership --------------------------------------------------------------------------------------
    def _plan(self) -> None:
        """Cut the flat parameters into shards for the current world and make this rank's shard optimizer."""
        self.rank, self.size = hvd.rank(), hvd.size()
        # An elastic job may shrink below sync.ps_servers: then every rank left is a server.
        servers = min(self.sync.ps_servers, self.size)
        self.servers = server_count(self.size, servers)
        self.splits = push_splits(self.numel, self.size, servers)
        self.lo, self.hi = chunk_bounds(self.numel, self.servers)[self.rank] if self.rank < self.servers else (0, 0)
        self.shard = torch.nn.Parameter(self._flat_params()[self.lo:self.hi].clone())
        self.shard_optimizer = type(self.optimizer)([self.shard], **_options(self.optimizer))
        _initialise_state(self.shard_optimizer, [self.shard])

    def _current(self) -> None:
        """Before any use: re-cut the shards if the world changed (an elastic reset), and take this rank's shard of
        a loaded full state."""
        if (hvd.rank(), hvd.size()) != (self.rank, self.size):
            if self._full is None:
                raise RuntimeError(
                    f"optimizer: the world changed from {self.size} to {hvd.size()} workers and this parameter "
                    "server holds only its old shard of the optimizer state; load_state_dict() a consolidated "
                    "state on every rank first (hvdsync's elastic state does it on every reset)")
            self._plan()
            self._loaded = None
        if self._full is not None and self._loaded is not self._full:
            self.shard_optimizer.load_state_dict(self._cut(self._full))
            self._loaded = self._full

    # ---- saving and restoring the sharded state -----------------------------------------------------------------
    def _kinds(self) -> dict[str, bool]:
        """Per key of the shard optimizer's state: True for one value per element (momentum, Adam's moments),
        False for a scalar (Adam's step). Anything else cannot be cut along the flat vector."""
        kinds = {}
        for key, value in self.shard_optimizer.state[self.shard].items():
            if torch.is_tensor(value) and value.dim() == 1 and value.shape[0] == self.hi - self.lo:
                kinds[key] = True
            elif not torch.is_tensor(value) or value.dim() == 0:
                kinds[key] = False
            else:
                raise ValueError(
                    f"optimizer: {type(self.optimizer).__name__}'s state {key!r} has shape {tuple(value.shape)} for a "
                    f"shard of {self.hi - self.lo} values; sync.mode 'ps' saves and re-shards only optimizers whose "
                    "state is one value per parameter element or a scalar (SGD, Adam, AdamW, RMSprop, ...)")
        return kinds

    def consolidate_state_dict(self) -> None:
        """Gather every owner's shard of the optimizer state (a collective: every rank must call it, at the same
        point). Afterwards, until the next step, :meth:`state_dict` returns the full state on every rank.

        Right after :meth:`load_state_dict` the full state is already here and nothing is exchanged; loads happen
        on every rank alike (a restore, a sync), except a checkpoint read by rank 0 alone, which must not wait.
        """
        self._current()
        if self._full is not None:
            return
        kinds = self._kinds()
        mine = {k: (v.detach().cpu() if torch.is_tensor(v) else v)
                for k, v in self.shard_optimizer.state[self.shard].items()}
        # Pickled through Horovod (a commit or a checkpoint, not every step); shards arrive in rank order, which is
        # the order of the contiguous shards, and ranks >= servers own nothing.
        shards = hvd.allgather_object(mine, name="hvdsync.ps.state")[:self.servers]
        flat = {k: torch.cat([s[k] for s in shards]) for k, elementwise in kinds.items() if elementwise}
        state = {}
        for index, offset, p in self._layout if kinds else ():
            state[index] = {k: (flat[k][offset:offset + p.numel()].view_as(p).clone() if elementwise else
                                copy.deepcopy(shards[0][k])) for k, elementwise in kinds.items()}
        groups = self.optimizer.state_dict()["param_groups"]
        self._full = self._loaded = {"state": state, "param_groups": groups}

    def state_dict(self) -> dict:
        """The full optimizer state (after :meth:`consolidate_state_dict` on every rank)."""
        if self._full is None:
            raise RuntimeError("optimizer: sync.mode 'ps' keeps the optimizer state sharded over the owners; call "
                               "consolidate_state_dict() on every rank first, then state_dict()")
        return self._full

    def load_state_dict(self, state: dict) -> None:
        """Load a full state (every rank): the hyperparameters now, this rank's shard at its next use, cut for the
        world of that moment."""
        self.optimizer.load_state_dict({"state": {}, "param_groups": state["param_groups"]})
        self._full = state

    def _cut(self, full: dict) -> dict:
        """This rank's shard of a full state, as the shard optimizer's state dict."""
        kinds = self._kinds()
        per_param = full["state"]
        shard = {}
        for key, elementwise in kinds.items():
            if elementwise:
                # A parameter without this state (none saved for it) contributes zeros, as a fresh optimizer has.
                flat = torch.cat([per_param[index][key].reshape(-1).to(p.dtype) if key in per_param.get(index, {})
                                  else torch.zeros(p.numel(), dtype=p.dtype) for index, _, p in self._layout])
                shard[key] = flat[self.lo:self.hi].clone().to(self.shard.device)
            else:
                saved = next((s[key] for s in per_param.values() if key in s), None)
                shard[key] = copy.deepcopy(saved) if saved is not None else \
                    self.shard_optimizer.state[self.shard][key]
        return {"state": {0: shard}, "param_groups": [{**_options(self.optimizer), "params": [0]}]}

    def _synchronize(self) -> None:
        self._current()
        pieces, ctx = [], []
        for p in self.params:
            # densify: an embedding's sparse gradient (sync.sparse is dense with this mode) travels as the table
            g = densify(p.grad) if p.grad is not None else torch.zeros_like(p)
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
        self._current()
        self._full = self._loaded = None  # the state moves on: a full state gathered or loaded before is stale
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
        self._scatter(self._allreduce_average(tensors, "hvdsync.local_sgd.average"), tensors)
        self.averages += 1

    def _synchronize(self) -> None:
        if not local_sgd.synchronous(self.steps + 1, self.sync.warmup_steps):
            return  # a local step: nothing to wait for
        for p in self.params:
            if p.grad is None:  # a parameter the loss did not touch still joins the all-reduce (as zeros)
                p.grad = torch.zeros_like(p)
            p.grad = densify(p.grad)  # an embedding's sparse gradient is all-reduced as the table (sync.sparse dense)
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
