"""The framework-free half of elastic training: what is committed, and the commit / restore / sync cycle.

Horovod's elastic protocol (``horovod/common/elastic.py``): workers train inside a wrapper; ``commit()`` saves the
state in memory and checks for host changes; when a collective fails (a worker died) every survivor gets
``HorovodInternalError``, restores the last commit, re-forms the ring (``shutdown`` + ``init``) and re-syncs from
rank 0; when hosts are added or removed, ``commit()`` raises ``HostsUpdatedInterrupt`` on every rank at the same
step and they re-form the ring without restoring. Ranks are reassigned on each reset, so rank 0 may be another
process afterwards; a joining worker starts from rank 0's committed state.

:class:`CommittedState` is that state for hvdsync, once for both frameworks, without Horovod: Horovod's own
``State`` (the host-update queue, the reset callbacks) is mixed in by :class:`hvdsync.elastic.ElasticState`, which
is what the adapters build, and :func:`hvdsync.elastic.run` is Horovod's ``run_fn`` loop with the reset log added.
The adapter hands it the framework's part as a :class:`Tensors` object (model and optimizer: save in memory,
restore, broadcast from rank 0, to and from checkpoint bytes); the core keeps the rest:

* the **position in the shard plan**: epoch, ``consumed`` (samples of this epoch's global order already trained
  on, by any world size) and the global step count. After a world-size change the rest of the epoch is re-planned
  with ``ShardPlan.resized(n).epoch(e, rank, start=consumed)``, so no sample is read twice or skipped;
* the MLflow run id (a new rank 0 keeps writing to the same run);
* the codec state (``state_dict()`` / ``load_state_dict()``, e.g. error-feedback residuals), when there is one;
* user objects (``state.user[...]``): anything deep-copyable; JSON-able ones also go into durable checkpoints;
* the reset log (when, why, world size before and after, recovery time): never rolled back.

Every ``commit_every`` steps the state commits; every ``checkpoint_every``-th commit rank 0 also writes a durable
checkpoint (:mod:`hvdsync.core.elastic.checkpoint`).
"""
from __future__ import annotations

import copy
import io
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import numpy as np
from hvdsync.core.elastic._store import CheckpointStore
from hvdsync.core.elastic.checkpoint import CheckpointError, undecodable


@dataclass
class Position:
    """Where training is: ``epoch``, samples of it ``consumed`` (global, any world size), optimizer ``step``s."""

    epoch: int = 0
    consumed: int = 0
    step: int = 0


class Tensors(Protocol):
    """The framework's part of the state, implemented by each adapter (``hvdsync.<framework>.elastic``)."""

    fingerprint: str

    def save(self) -> None:
        """Copy the model and optimizer values to host memory (the in-memory commit). Every rank calls it at the
        same point, so it may be a collective: state sharded over ranks (a parameter server's optimizer state) is
        gathered whole into every rank's copy, so a lost rank's shard survives and a world of another size can cut
        it anew. Right after :meth:`from_files` (rank 0 alone, loading a checkpoint) it must not communicate."""

    def restore(self) -> None:
        """Put the last saved values back (undo uncommitted steps)."""

    def sync(self) -> None:
        """Broadcast rank 0's values to every rank (a collective)."""

    def to_files(self) -> dict[str, bytes]:
        """The saved values (the whole state, as :meth:`save` copied it) as checkpoint files; no pickled code."""

    def from_files(self, files: dict[str, bytes]) -> None:
        """Load values written by :meth:`to_files` (by value, never unpickling code)."""


def _codec_bytes(state: dict) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **{k: np.asarray(v) for k, v in state.items()})
    return buf.getvalue()


def _codec_from_bytes(blob: bytes) -> dict:
    with np.load(io.BytesIO(blob), allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


class CommittedState:
    """One elastic state for both frameworks (see the module docstring), to be combined with Horovod's ``State``,
    the next class in the method order of :class:`hvdsync.elastic.ElasticState`: it provides ``_bcast_object``,
    ``_rank``, ``register_reset_callbacks``, ``on_reset`` and ``check_host_updates``, which this class calls.

    Args:
        tensors: the adapter's :class:`Tensors`.
        bcast_object: Horovod's ``broadcast_object`` for the framework (picklable Python objects from rank 0).
        get_rank / get_size: Horovod's ``rank`` / ``size``.
        commit_every: commit every this many optimizer steps.
        store: a :class:`~hvdsync.core.elastic._store.CheckpointStore` for durable checkpoints, or None.
        checkpoint_every: rank 0 writes a durable checkpoint every this many commits.
        codec: an object with ``state_dict()`` / ``load_state_dict()`` (compression state), or None.
        on_event: called with each completed reset record (rank 0 prints and tracks it).
        user: user objects, committed and restored with the rest (``state.user["name"]``).
    """

    def __init__(self, tensors: Tensors, bcast_object: Callable, get_rank: Callable[[], int],
                 get_size: Callable[[], int], commit_every: int = 10, store: CheckpointStore | None = None,
                 checkpoint_every: int = 1, codec: Any = None, on_event: Callable[[dict], None] | None = None,
                 **user: Any) -> None:
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)  # Horovod's State, next in the method order
        self.tensors, self._size = tensors, get_size
        self.commit_every, self.checkpoint_every = commit_every, checkpoint_every
        self.store, self.codec, self.on_event = store, codec, on_event
        self.position, self.run_id, self.user = Position(), None, dict(user)
        self.events: list[dict] = []      # completed resets; never rolled back
        self._pending: dict | None = None  # a reset whose first step after it has not completed yet
        self._commits = 0
        self._saved = self._snapshot()

    # ---- what is committed ------------------------------------------------------------------------------------------
    def _snapshot(self) -> dict:
        # The job id travels with the rest: every rank (a joining one, a new rank 0) writes as rank 0's job.
        return copy.deepcopy({"position": asdict(self.position), "run_id": self.run_id, "user": self.user,
                              "codec": self.codec.state_dict() if self.codec is not None else None,
                              "job_id": self.store.job_id if self.store is not None else ""})

    def _apply(self, saved: dict) -> None:
        saved = copy.deepcopy(saved)
        self.position, self.run_id, self.user = Position(**saved["position"]), saved["run_id"], saved["user"]
        if self.store is not None and saved.get("job_id"):
            self.store.job_id = saved["job_id"]
        if self.codec is not None and saved["codec"] is not None:
            self.codec.load_state_dict(saved["codec"])

    def save(self) -> None:
        self.tensors.save()
        self._saved = self._snapshot()

    def restore(self) -> None:
        self.tensors.restore()
        self._apply(self._saved)

    def sync(self) -> None:
        # Tensors first (collectives with fixed names), then the Python part as one object from rank 0; the reset
        # log travels too, so a joining worker (or a new rank 0) knows the job's history.
        self.tensors.sync()
        self.save()
        self._saved, self.events, self._pending = self._bcast_object((self._saved, self.events, self._pending))
        self._apply(self._saved)

    # ---- the training loop's calls ----------------------------------------------------------------------------------
    def plan_state(self) -> dict[str, int]:
        """``{"epoch", "consumed"}`` of the committed position: load it into a fresh ``hvdsync.torch.PlanSampler``
        (built for the current world size) on every (re-)entry of the training function, and the sampler reads
        exactly the samples of the epoch not yet trained on."""
        return {"epoch": self.position.epoch, "consumed": self.position.consumed}

    def step_done(self, global_samples: int) -> None:
        """After every optimizer step: advance the position; close a pending reset record; commit when due.

        May raise ``HostsUpdatedInterrupt`` (from the commit) on every rank at this same step.
        """
        self.position.step += 1
        self.position.consumed += int(global_samples)
        if self._pending is not None:
            event, self._pending = self._pending, None
            event["recovery_seconds"] = time.time() - event["time"]
            event["step"] = self.position.step
            self.events.append(event)
            if self.on_event is not None:
                self.on_event(event)
        if self.position.step % self.commit_every == 0:
            self.commit()

    def epoch_done(self) -> None:
        """After an epoch: the next one starts at sample 0; commit (an epoch boundary is always a commit)."""
        self.position.epoch += 1
        self.position.consumed = 0
        self.commit()

    def commit(self) -> None:
        """Save in memory; every ``checkpoint_every``-th commit rank 0 writes a durable checkpoint; then check for
        host changes (Horovod's ``check_host_updates``, a small broadcast)."""
        self.save()
        self._commits += 1
        if self.store is not None and self._rank() == 0 and self._commits % self.checkpoint_every == 0:
            self.write_checkpoint()
        self.check_host_updates()

    # ---- durable checkpoints ----------------------------------------------------------------------------------------
    def write_checkpoint(self) -> None:
        """Write the last commit to the store (call on rank 0)."""
        files = self.tensors.to_files()
        if self._saved["codec"] is not None:
            files["codec.npz"] = _codec_bytes(self._saved["codec"])
        meta = {"position": self._saved["position"], "run_id": self._saved["run_id"],
                "world_size": self._size(), "user": _jsonable(self._saved["user"])}
        self.store.save(self._saved["position"]["step"], files, meta)

    def load_checkpoint(self, job_id: str | None = None) -> bool:
        """Load the newest valid checkpoint (of job ``job_id``, when given) into this rank's state, reporting any
        skipped; False if none. A checkpoint whose payload passes its checksum but does not decode is skipped like
        a damaged one, and the next older one is tried. Call on rank 0 before :func:`run`: its first ``sync()``
        hands the loaded state to every rank."""
        if self.store is None:
            return False
        fresh = self._snapshot()
        return self.store.latest(job_id=job_id, load=lambda ckpt: self._load(ckpt, fresh)) is not None

    def _load(self, ckpt, fresh: dict) -> None:
        try:
            self.tensors.from_files(ckpt.files)
            meta = ckpt.meta
            self.position = Position(**meta["position"])
            self.run_id = meta.get("run_id")
            self.user.update(meta.get("user", {}))
            if self.codec is not None and "codec.npz" in ckpt.files:
                try:
                    self.codec.load_state_dict(_codec_from_bytes(ckpt.files["codec.npz"]))
                except Exception as exc:  # noqa: BLE001 - numpy's and the codec's errors alike: an unusable file
                    raise undecodable("codec.npz", exc) from None
        except (CheckpointError, KeyError, TypeError) as exc:
            # Part of it may be in the model already: back to the values before this attempt, then the next older.
            self.tensors.restore()
            self._apply(fresh)
            detail = str(exc) if isinstance(exc, CheckpointError) else f"manifest.json: unusable metadata ({exc!r})"
            raise CheckpointError(f"{ckpt.path}/{detail}") from None
        self.save()

    # ---- resets -----------------------------------------------------------------------------------------------------
    def interrupted(self, reason: str) -> None:
        """Called by :func:`run` when a reset starts: remember when, why and the world size before it."""
        if self._pending is None:  # a second failure during recovery extends the same record
            self._pending = {"time": time.time(), "reason": reason, "size_before": self._size()}

    def reset(self) -> None:
        if self._pending is not None:
            self._pending["size_after"] = self._size()


def _jsonable(user: dict) -> dict:
    """The user objects that survive a JSON round trip (only those go into a durable checkpoint: no pickle)."""
    out = {}
    for k, v in user.items():
        try:
            out[k] = json.loads(json.dumps(v.tolist() if isinstance(v, np.ndarray) else v))
        except (TypeError, ValueError):
            continue
    return out
