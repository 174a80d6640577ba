"""Horovod's elastic protocol around hvdsync's committed state, once for both adapters (framework-free).

The core's :class:`~hvdsync.core.elastic.state.CommittedState` knows what is committed and when; Horovod's
``horovod.common.elastic.State`` knows how a host change reaches every rank at the same step (its notification
queue, checked by a small broadcast in ``check_host_updates``). :class:`ElasticState` is the two together, and
:func:`run` is Horovod's ``run_fn`` loop with hvdsync's reset log. The core stays free of Horovod; this module is
where the two meet.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

from horovod.common.elastic import State, notification_manager
from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt

from hvdsync.core.elastic._store import CheckpointStore
from hvdsync.core.elastic.jobs import JOB_ID_ENV, RESUME_JOB_ENV, claim, job_config, new_job_id
from hvdsync.core.elastic.state import CommittedState, Position, Tensors


class ElasticState(CommittedState, State):
    """hvdsync's committed state on Horovod's elastic ``State`` (arguments: :class:`CommittedState`).

    Example (inside a worker; the adapters build it for you, see ``hvdsync.torch.elastic_state``)::

        state = ElasticState(tensors, hvd.broadcast_object, hvd.rank, hvd.size, commit_every=10)
        run(train, state, reset=lambda: (hvd.shutdown(), hvd.init()))
    """


def configured_state(tensors: Tensors, cfg, bcast_object: Callable, get_rank: Callable[[], int],
                     get_size: Callable[[], int], reset_callbacks: tuple = (), codec: Any = None,
                     on_event: Callable[[dict], None] | None = None, **user: Any) -> ElasticState:
    """An :class:`ElasticState` as ``cfg.elastic`` says (what both adapters' ``elastic_state`` call): commit and
    checkpoint intervals, the store (keyed by the model's fingerprint), the reset callbacks (the learning-rate
    rule) and, with ``elastic.resume``, the newest valid checkpoint loaded on rank 0 (the first sync hands it on)."""
    e = cfg.elastic
    store, resume_from = None, None
    if e.checkpoint_dir:
        # The job id: the launcher's (hvdsync.launch.elastic decided it before any worker started), else one made
        # here; rank 0's wins at the first sync, so every rank writes as one job.
        store = CheckpointStore(e.checkpoint_dir, e.keep, tensors.fingerprint, job_config=job_config(cfg.flat()),
                                job_id=os.environ.get(JOB_ID_ENV) or new_job_id())
        if e.resume and get_rank() == 0:
            if RESUME_JOB_ENV in os.environ:  # the launcher chose it ("": checkpoints without a job record)
                resume_from = os.environ[RESUME_JOB_ENV]
            else:  # a script of the user's: the same rules, applied here (a refusal fails the worker in one line)
                chosen = claim(store, store.job_config, resume=True)
                if chosen.resumed is not None:
                    store.job_id, resume_from = chosen.job_id, chosen.resumed.id
                    print(f"hvdsync: {chosen.line()}", file=sys.stderr, flush=True)
    state = ElasticState(tensors, bcast_object, get_rank, get_size, commit_every=e.commit_every, store=store,
                         checkpoint_every=e.checkpoint_every, codec=codec, on_event=on_event, **user)
    state.register_reset_callbacks(list(reset_callbacks))
    if e.resume and get_rank() == 0 and store is not None:
        state.load_checkpoint(job_id=resume_from)
    return state


def run(func: Callable, state: ElasticState, reset: Callable[[], None],
        translate: Callable[[BaseException], BaseException | None] | None = None) -> Any:
    """Run ``func(state)`` elastically: Horovod's ``run_fn`` loop, plus the reset log.

    Args:
        func: the training function; it must not call collectives before its first ``state`` call returns.
        state: the :class:`ElasticState`.
        reset: re-forms the ring (``hvd.shutdown(); hvd.init()`` for the framework).
        translate: turns a framework error into ``HorovodInternalError`` where it is a collective failure
            (TensorFlow raises its own error types), else returns None.
    """
    notification_manager.init()
    notification_manager.register_listener(state)
    skip_sync = False
    try:
        while True:
            try:
                if not skip_sync:
                    state.sync()
                return func(state)
            except HorovodInternalError:
                state.interrupted("worker lost")
                state.restore()
                skip_sync = False
            except HostsUpdatedInterrupt as exc:
                # skip_sync is True when hosts were only removed: every survivor already holds the same commit.
                state.interrupted("hosts removed" if exc.skip_sync else "hosts added")
                skip_sync = exc.skip_sync
            except Exception as exc:
                translated = translate(exc) if translate is not None else None
                if translated is None:
                    raise
                state.interrupted("worker lost")
                state.restore()
                skip_sync = False
            reset()
            state.on_reset()
    finally:
        notification_manager.remove_listener(state)


__all__ = ["ElasticState", "Position", "Tensors", "configured_state", "run"]
