"""``sync.mode: ps`` for PyTorch: push gradients to the shard owners, update at the owner, pull the parameters."""
from __future__ import annotations

import copy

import horovod.torch as hvd
import numpy as np
import torch

from hvdsync.core.comm.traffic import chunk_bounds
from hvdsync.core.comm.schemes.ps import push_bytes, push_splits, server_count
from hvdsync.torch.schemes.base import SchemeOptimizer, _initialise_state, _options
from hvdsync.torch.sparse import densify


def push(flat: torch.Tensor, splits: list[int], rank: int, name: str) -> torch.Tensor:
    """The push of a parameter-server round: every rank sends ``splits[j]`` consecutive elements of ``flat`` to rank
    j (one ``hvd.alltoall``) and each owner adds the W pieces of its shard it received (ranks with
    ``splits[rank] == 0`` own nothing and get an empty tensor). Returns this rank's summed shard.

    Not ``hvd.reducescatter``, even when every rank owns a shard: Horovod 0.28.1 runs it on Gloo as
    ``gloo::ReduceScatterHalvingDoubling``, which (1) sends from its working buffer asynchronously and then, on
    every rank but 0, copies its reduced chunk over the start of that same buffer without waiting for the send, so
    rank 0 intermittently adds a half-reduced piece (seen at 64 MiB on 2 workers: 4 wrong results in 20), and
    (2) allocates and zeroes two scratch buffers of the whole size per call and does not overlap its reduction with
    the transfer: 1.3-3.4x the time of this push at 1-64 MiB here (``benchmarks/costmodel.py``, the pieces table).
    The alltoall moves the same bytes (each rank sends (W-1)/W of the buffer) in one step.

    Example:
        >>> push(flat, push_splits(flat.numel(), hvd.size(), 0), hvd.rank(), "grads")  # doctest: +SKIP
    """
    mine = splits[rank]
    received, _ = hvd.alltoall(flat, splits=torch.tensor(splits, dtype=torch.int32), name=name)
    # Rows in source-rank order: the same order of additions on every owner, whatever the timing.
    return received.view(len(splits), mine).sum(dim=0) if mine else received[:0]


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
        reduced = push(flat, self.splits, self.rank, "hvdsync.ps.push")
        sent, received = push_bytes(flat.numel(), mine, self.size, itemsize)
        self.sent, self.received = self.sent + sent, self.received + received
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
        received, sent = push_bytes(self.numel, mine, self.size, itemsize)   # the pull: the push's mirror
        self.sent, self.received = self.sent + sent, self.received + received
        self._set_params(flat)
        self.rounds += 1
