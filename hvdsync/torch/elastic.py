"""Elastic state for PyTorch: Horovod's ``TorchState`` handlers for the tensors, hvdsync's core for the rest.

Horovod 0.28.1's ``hvd.elastic.TorchState`` works on torch: it deep-copies the model's and optimizer's
``state_dict`` on commit, loads them back on restore and broadcasts them from rank 0 on sync. hvdsync uses its
handlers for exactly that and adds, in the core (:class:`hvdsync.core.elastic.state.ElasticState`), the shard-plan
position, the MLflow run id, codec state, user objects, durable checkpoints and the reset log.

Inside a user's own script (launched with ``horovodrun --host-discovery-script ...``, see
``examples/elastic_torch.py``)::

    state = hs.elastic_state(model, optimizer, cfg)      # after building model and optimizer, before any collective
    hs.run_elastic(train, state)                          # train(state) reads state.position, calls state.step_done()
"""
from __future__ import annotations

import copy
import hashlib
import io
from collections.abc import Callable, Sequence
from typing import Any

import horovod.torch as hvd
import torch

from hvdsync.core.elastic.checkpoint import undecodable
from hvdsync.elastic import ElasticState, configured_state, run
from hvdsync.fitting import fit_elastic_with
from hvdsync.torch.optimizer import mark_broadcast_done
from hvdsync.core.train._scaling import scaled_lr


def fingerprint(model: torch.nn.Module) -> str:
    """A short hash of the parameter names, shapes and dtypes: a checkpoint of another model does not match."""
    text = ";".join(f"{k}:{tuple(v.shape)}:{v.dtype}" for k, v in model.state_dict().items())
    return "torch-" + hashlib.sha256(text.encode()).hexdigest()[:16]


class TorchTensors:
    """The torch part of the elastic state (:class:`hvdsync.core.elastic.state.Tensors`).

    The model goes through Horovod's ``TorchState`` handler (a deep copy of its ``state_dict`` in host memory,
    broadcast from rank 0 on sync). The optimizer is handled here, because Horovod's handler only recognises a
    ``torch.optim.Optimizer`` and keeps anything else (hvdsync's codec and sync-mode optimizers) by reference, so
    their state was neither committed nor restored. Every optimizer's committed copy is its ``state_dict()``; a
    sharded one (``sync.mode: ps``, which has ``consolidate_state_dict``) first gathers every owner's shard, so the
    copy on every rank holds the whole state: a lost owner's shard survives, and loading the copy into a world of
    another size cuts it into that world's shards.
    """

    def __init__(self, model: torch.nn.Module, optimizer) -> None:
        self.model, self.optimizer = model, optimizer
        self._inner = hvd.elastic.TorchState(model=model)
        self._sharded = hasattr(optimizer, "consolidate_state_dict")
        # A sharded state is gathered at the first save (inside the elastic loop: no collective may run before).
        self._optimizer_state = None if self._sharded else copy.deepcopy(optimizer.state_dict())
        self.fingerprint = fingerprint(model)

    def save(self) -> None:
        self._inner.save()
        if self._sharded:
            self.optimizer.consolidate_state_dict()  # a collective: every rank saves at the same commit
        self._optimizer_state = copy.deepcopy(self.optimizer.state_dict())

    def restore(self) -> None:
        self._inner.restore()
        if self._optimizer_state is not None:
            self.optimizer.load_state_dict(self._optimizer_state)

    def sync(self) -> None:
        # Everything from rank 0 here: hvdsync's distributed optimizer must not broadcast again before its first
        # step (a joining worker would broadcast alone and wait forever).
        mark_broadcast_done(self.model, self.optimizer)
        # The optimizer before the model: on a rank whose optimizer has no state yet (a joining worker, or every
        # rank but 0 of a resumed job) Horovod's broadcast_optimizer_state first takes a step on zero gradients to
        # create it, and with weight decay that step moves the parameters; the model's broadcast then undoes it.
        if isinstance(self.optimizer, torch.optim.Optimizer):  # Horovod's own (or a plain one): its tensor broadcast
            hvd.broadcast_optimizer_state(self.optimizer, root_rank=0)
        else:
            # Rank 0's committed copy equals its live state here (a sync follows a restore, a commit or a load),
            # and for a sharded optimizer only the copy is whole. None: a fresh job, every rank holds the same state.
            state = hvd.broadcast_object(self._optimizer_state if hvd.rank() == 0 else None, root_rank=0,
                                         name="hvdsync.elastic.optimizer")
            if state is not None:
                self.optimizer.load_state_dict(state)
        self._inner.sync()

    def reshard(self) -> None:
        """A reset callback: give a sharded optimizer its committed whole state again, to be cut for the new world
        (after hosts were removed no sync follows, and the survivors' live shards are laid out for the old one)."""
        if self._sharded and self._optimizer_state is not None:
            self.optimizer.load_state_dict(self._optimizer_state)

    def to_files(self) -> dict[str, bytes]:
        # Called right after save(): the live model is the committed one; the optimizer's whole state is the copy.
        # Tensors and plain containers only.
        buf = io.BytesIO()
        torch.save({"model": self.model.state_dict(), "optimizer": self._optimizer_state}, buf)
        return {"torch_state.pt": buf.getvalue()}

    def from_files(self, files: dict[str, bytes]) -> None:
        # weights_only=True: torch's restricted unpickler loads tensors and plain containers, never code.
        try:
            saved = torch.load(io.BytesIO(files["torch_state.pt"]), map_location="cpu", weights_only=True)
            self.model.load_state_dict(saved["model"])
            self.optimizer.load_state_dict(saved["optimizer"])
        except Exception as exc:  # noqa: BLE001 - torch.load raises anything (IndexError, UnpicklingError, ...)
            # Bytes that passed the checksum but are no torch state of this model: skipped like a damaged file.
            raise undecodable("torch_state.pt", exc) from None


def follow_world_size(optimizer: torch.optim.Optimizer, base_lr: float, rule: str) -> Callable[[], None]:
    """A reset callback that sets the learning rate for the new world size (``train.lr_scaling``: ``none`` keeps
    ``base_lr``, ``linear`` multiplies it by the number of workers)."""

    def callback() -> None:
        for group in optimizer.param_groups:
            group["lr"] = scaled_lr(base_lr, hvd.size(), rule)

    return callback


def elastic_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, cfg=None, codec: Any = None,
                  on_event: Callable[[dict], None] | None = None, **user: Any) -> ElasticState:
    """The elastic state of a torch job, configured by ``cfg.elastic`` (and the lr rule by ``cfg.train``).

    Args:
        model / optimizer: yours (the optimizer may be Horovod's ``DistributedOptimizer``).
        cfg: a :class:`hvdsync.config.Config` (default: ``Config()``).
        codec: compression state with ``state_dict()`` / ``load_state_dict()``, if any.
        on_event: called with each reset record once the first step after it completes.
        user: your own objects, committed and restored with the rest (``state.user["name"]``).

    With ``cfg.elastic.resume``, rank 0 loads the newest valid checkpoint now; the first sync hands it to every rank.
    """
    from hvdsync.config import Config

    cfg = cfg or Config()
    tensors = TorchTensors(model, optimizer)
    return configured_state(tensors, cfg, hvd.broadcast_object, hvd.rank, hvd.size,
                            [follow_world_size(optimizer, cfg.train.lr, cfg.train.lr_scaling), tensors.reshard],
                            codec, on_event, **user)


def _reset() -> None:
    hvd.shutdown()
    hvd.init()


def run_elastic(func: Callable, state: ElasticState) -> Any:
    """Run ``func(state)`` elastically on torch (see :func:`hvdsync.elastic.run`)."""
    return run(func, state, _reset)


def fit_elastic(cfg=None, data=None, record_reads: bool = False, *, callbacks: Sequence = ()):
    """hvdsync's built-in PyTorch model trained elastically (``hvdsync train --elastic``), in each worker of an
    elastic job: :func:`hvdsync.fitting.fit_elastic_with` on torch (``callbacks``, the deprecated ``record_reads``)."""
    from hvdsync.torch.runtime import init
    from hvdsync.torch.train import build

    return fit_elastic_with(init, build, elastic_state, run_elastic, cfg, data, record_reads, callbacks)
