"""Which samples each rank trained on: :class:`SampleLedger`, a callback of the shared loop.

In an elastic run (``fit_elastic(cfg, callbacks=[SampleLedger()])``) the ledger keeps its counts in the committed
state's user objects (``state.user["reads"]`` and ``["timeline"]``): a restore rolls them back with the model, so they
count committed training exactly, across resets and changes of world size. That is how the tests and notebook 10
show that no sample of an epoch is read twice and none is skipped. Outside an elastic run it keeps them itself.
"""
# Private home of SampleLedger: their public names are the adapters' (hvdsync.torch.X, hvdsync.tensorflow.X), and
# hvdsync.core.elastic.ledger (the path documented before 0.3.0) forwards them with a DeprecationWarning until 0.4.0. hvdsync
# imports them from here so that it never warns; a private name, not a new public module, so the core gets no
# second documented path for them.
from __future__ import annotations

import time

import numpy as np

from hvdsync.core.train.callbacks import Callback


class SampleLedger(Callback):
    """Records, at every step, the sample indices each rank trained on (one all-gather per step: a tool for tests
    and lessons, not for a long run).

    After training, :attr:`reads` is ``[epoch][sample]``: how often each sample was trained on in each epoch (all ranks
    together), and :attr:`timeline` one row per step: ``[unix time, job step, world size, samples of rank 0, ...]``.
    An elastic run's result carries both (``ElasticResult.reads``, ``.timeline``).

    Example:
        >>> ledger = SampleLedger()
        >>> result = hvdsync.torch.fit_elastic(cfg, callbacks=[ledger])  # doctest: +SKIP
        >>> all(n == 1 for epoch in result.reads for n in epoch)          # doctest: +SKIP
        True
    """

    def __init__(self) -> None:
        self._state = None
        self._own: dict = {}

    @property
    def _user(self) -> dict:
        # The state's user dict is replaced on every restore: look it up each time.
        return self._state.user if self._state is not None else self._own

    def on_train_begin(self, ctx) -> None:
        self._state = ctx.state
        user = self._user
        user.setdefault("reads", np.zeros((ctx.settings.epochs, ctx.plan.dataset_size), dtype=np.int64))
        user["reads"] = np.asarray(user["reads"], dtype=np.int64)  # a list after a JSON checkpoint
        user.setdefault("timeline", [])

    def on_step_end(self, ctx) -> None:
        # Each rank reports the indices it really trained on, padded to a length that is the same on every rank
        # (the all-gather needs it): no rank's share of a step exceeds the global step.
        step = ctx.last_step
        mine = np.full(ctx.plan.global_batch_at(ctx.epoch), -1, dtype=np.float64)
        mine[:step.local_count] = step.indices
        everyone = ctx.backend.allgather(mine)
        user = self._user
        for row in everyone:
            np.add.at(user["reads"][ctx.epoch], row[row >= 0].astype(np.int64), 1)
        user["timeline"].append([time.time(), ctx.job_step, ctx.size, *[int((row >= 0).sum()) for row in everyone]])

    @property
    def reads(self) -> list[list[int]] | None:
        """``[epoch][sample]``: times each sample was trained on (None before training)."""
        reads = self._user.get("reads")
        return None if reads is None else np.asarray(reads).tolist()

    @property
    def timeline(self) -> list[list[float]] | None:
        """One row per step: ``[unix time, job step, world size, samples of each rank ...]`` (None before training)."""
        return self._user.get("timeline")
