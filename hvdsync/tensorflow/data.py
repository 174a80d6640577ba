"""``tf.data`` by the core plan (:class:`hvdsync.tensorflow.ShardPlan`): the plan's index stream for the user's own pipeline
(:class:`PlanSampler`, also a Keras callback), and a loader over in-memory arrays (:class:`ShardedLoader`)."""
from __future__ import annotations

import warnings
from typing import Callable, Iterator, Sized

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf

from hvdsync.core.train.loader import PlanLoader
from hvdsync.core.train._scaling import grown_lr, loss_scale
from hvdsync.core.train.shares import rebalanced
from hvdsync.core.train._plan import ShardPlan, Step
from hvdsync.tensorflow.models import constant_learning_rate


class PlanSampler(keras.callbacks.Callback):
    """This rank's share of the global plan as a ``tf.data`` stream of index batches, for any ``tf.data`` pipeline.

    :meth:`dataset` yields one element per micro-batch: ``(indices, weights)``, int64 sample indices into the
    user's data and float32 per-sample loss weights. The user maps the indices onto their own lookup (arrays,
    files, a ``tf.data`` of records) and hands ``(x, y, weights)`` to ``model.fit``. Every sample is read exactly
    once per epoch over all ranks and every rank gets the same number of batches (the short last step's batches may
    be smaller, even empty), so no rank waits in an all-reduce another never joins. The weights keep each sample's
    share of the update at 1 / (samples in the global step) under Keras' convention: its mean loss per batch,
    divided by ``accumulate`` in ``DistributedOptimizer.scale_loss`` (Keras' ``fit`` calls it; a loop of your own
    on these weights calls it too), and Horovod's average over ranks; so the update equals one process's on the
    same samples, also where micro-batches differ in size (a batch size that ``accumulate`` does not divide, the
    short last step); they are 1 where all are equal. (Metrics passed as ``metrics=`` ignore weights;
    ``weighted_metrics=`` use them.)

    Each pass over the stream is the next epoch (Keras starts the next epoch's pass before its epoch callbacks run,
    so the stream cannot wait for them); ``set_epoch(e)`` before a pass picks ``e``. As a Keras callback it keeps
    the training position: ``state_dict()`` holds ``(epoch, consumed)`` (samples of the epoch's global order that
    all ranks together trained on), and a sampler that loads it (any world size) streams exactly the unread
    samples. The same arguments as :class:`hvdsync.torch.PlanSampler`.

    Args:
        dataset: the data set (or its length).
        batch_size: samples per rank per optimizer step (split into ``accumulate`` micro-batches).
        accumulate: micro-batches per optimizer step (give the optimizer the same ``accumulate``).
        seed: the global seed of the epochs' order; shuffle: False reads 0..N-1 every epoch.
        rank, world_size: default ``hvd.rank()`` and ``hvd.size()`` (after ``init``).
        op: Horovod's reduce op (``average``, ``sum``), for the weights.
        growth: ``{epoch: factor}``, a batch that grows over the epochs (``data.batch_growth``); the stream's length
            then changes between epochs and is not asserted.
        growth_lr: with ``growth``, as a Keras callback the sampler sets the optimizer's learning rate of each
            epoch by this rule (``train.growth_lr``: ``sqrt``, ``linear``, ``none``;
            :func:`hvdsync.tensorflow.grown_lr`) from the rate it had when ``fit`` first started.

    A growing batch with Keras' ``fit``: each epoch has fewer batches than the one before, so the stream's length is
    not declared; Keras learns the first epoch's length and ends each later epoch when its pass runs out (the
    sampler silences Keras' "ran out of data" warning for that, which with a growing batch is the plan). Every
    sample is still read once per epoch, and the learning rate follows ``growth_lr``.

    Straggler-aware shares: ``rebalance(work_seconds)`` on every rank at an epoch's end (your seconds of reading,
    forward and backward; not the all-reduce wait) gives each rank a share of every later global step
    proportional to its throughput (:mod:`hvdsync.core.train.shares`); the weights stay exact. Keras' ``fit`` runs the
    all-reduce inside its step, so it cannot tell work from the wait: for a Keras model with adaptive shares use ``hs.fit(cfg, model=...)``
    (``data.shares: adaptive``), which measures the phases apart.

    Example::

        sampler = PlanSampler(len(images), batch_size=32)
        data = sampler.dataset(lambda i: (tf.gather(images, i), tf.gather(labels, i)))  # (x, y, weights)
        model.fit(data, epochs=5, shuffle=False, callbacks=[sampler, *standard_callbacks(cfg)])
    """

    def __init__(self, dataset: Sized | int, batch_size: int, accumulate: int = 1, seed: int = 0,
                 shuffle: bool = True, rank: int | None = None, world_size: int | None = None,
                 op: str = "average", growth=(), growth_lr: str = "sqrt") -> None:
        super().__init__()
        size = dataset if isinstance(dataset, int) else len(dataset)
        world_size = hvd.size() if world_size is None else world_size
        rank = hvd.rank() if rank is None else rank
        self.plan = ShardPlan(size, world_size, batch_size, accumulate, seed, shuffle, growth=growth)
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < world_size:
            raise ValueError(f"rank: {rank!r} is not allowed; expected 0 <= rank < {world_size} "
                             f"(the world has {world_size} ranks)")
        loss_scale(1, world_size, op)  # checks op now, not at the first step
        grown_lr(1.0, 1.0, growth_lr)  # checks the rule now, not at the first epoch
        self.rank, self.op, self.growth_lr = int(rank), op, growth_lr
        self.epoch, self.consumed = 0, 0  # the training position
        self._next = (0, 0)  # (epoch, start) the next pass over the stream reads
        self._planned: dict[int, np.ndarray] = {}  # epoch -> samples consumed after each of its steps

    @classmethod
    def from_config(cls, cfg, dataset: Sized | int, rank: int | None = None,
                    world_size: int | None = None) -> "PlanSampler":
        """Batch size, accumulation, seed, shuffle, op, batch growth and its learning-rate rule from a
        :class:`hvdsync.config.Config`."""
        return cls(dataset, cfg.data.batch_size, cfg.sync.accumulate, cfg.train.seed, cfg.data.shuffle, rank,
                   world_size, cfg.sync.op, cfg.data.batch_growth, cfg.train.growth_lr)

    # ---- position ----------------------------------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Train ``epoch`` next, from its beginning unless a loaded state points into that same epoch."""
        if not (epoch == self.epoch and 0 < self.consumed < self.plan.dataset_size):
            self.consumed = 0
        self.epoch = int(epoch)
        if epoch not in self._planned:  # not streamed yet (a hand-written loop): the next pass reads it
            self._next = (self.epoch, self.consumed)

    def state_dict(self) -> dict[str, int]:
        """``{"epoch", "consumed"}``; it does not depend on the world size."""
        return {"epoch": self.epoch, "consumed": self.consumed}

    def load_state_dict(self, state: dict) -> None:
        if not 0 <= int(state["consumed"]) <= self.plan.dataset_size:
            raise ValueError(f"consumed: {state['consumed']!r} is not allowed; the plan has "
                             f"{self.plan.dataset_size} samples")
        self.epoch, self.consumed = int(state["epoch"]), int(state["consumed"])
        self._next, self._planned = (self.epoch, self.consumed), {}

    def step_ends(self) -> np.ndarray:
        """Samples of the current epoch consumed after each of its optimizer steps in the pass being streamed
        (cumulative from where the pass started; empty before the pass)."""
        return self._planned.get(self.epoch, np.zeros(0, dtype=np.int64))

    def batches_per_epoch(self, epoch: int | None = None) -> int:
        """Micro-batches in a whole ``epoch`` (default: the current one; the same on every rank)."""
        return self.plan.steps_per_epoch(0, self.epoch if epoch is None else epoch) * self.plan.accumulate

    # ---- unequal shares (stragglers) ---------------------------------------------------------------------------
    def set_shares(self, shares) -> None:
        """Each rank's fraction of every global step from the next pass on (``None``: equal); the same on every
        rank (:mod:`hvdsync.core.train.shares`)."""
        self.plan = self.plan.with_shares(shares)

    def rebalance(self, work_seconds: float, allgather=None) -> tuple[float, ...]:
        """At an epoch's end, on every rank: shares for the next passes by each rank's throughput in this epoch
        (all-gathered through Horovod). Returns them."""
        shares = rebalanced(self.plan, self.epoch, self.rank, work_seconds, allgather or _allgather)
        self.set_shares(shares)
        return shares

    # ---- the stream --------------------------------------------------------------------------------------------
    def weights(self, step: Step, micro: np.ndarray) -> np.ndarray:
        """Per-sample loss weights of one micro-batch for a *mean* loss passed through the optimizer's
        ``scale_loss`` (which divides by accumulate): its size x accumulate x the loss scale. The weighted mean,
        divided so, is the micro-batch's summed loss x the loss scale: the accumulation rule's loss."""
        w = len(micro) * self.plan.accumulate * loss_scale(step.global_count, self.plan.world_size, self.op)
        return np.full(len(micro), w, np.float32)

    def _batches(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        epoch, start = self._next
        self._next = (epoch + 1, 0)
        steps = self.plan.epoch(epoch, self.rank, start)
        self._planned = {e: c for e, c in self._planned.items() if e >= epoch - 1}
        self._planned[epoch] = start + np.cumsum([s.global_count for s in steps], dtype=np.int64)
        for step in steps:
            for micro in step.micro:
                yield micro.astype(np.int64), self.weights(step, micro)

    def dataset(self, lookup: Callable | None = None,
                num_parallel_calls: int | None = tf.data.AUTOTUNE) -> tf.data.Dataset:
        """The index stream: ``(indices, weights)`` per micro-batch; with ``lookup(indices) -> (x, y)`` (TensorFlow
        ops, run in the ``tf.data`` graph) the ``(x, y, weights)`` batches ``model.fit`` takes. Prefetched; its
        length is known (one epoch), so Keras knows the epoch's batches from the start."""
        signature = (tf.TensorSpec((None,), tf.int64), tf.TensorSpec((None,), tf.float32))
        data = tf.data.Dataset.from_generator(self._batches, output_signature=signature)
        if self._next[1] == 0 and not self.plan.growth:  # a whole epoch, and every epoch as long
            data = data.apply(tf.data.experimental.assert_cardinality(self.batches_per_epoch(self._next[0])))
        if lookup is not None:
            data = data.map(lambda i, w: (*lookup(i), w), num_parallel_calls=num_parallel_calls)
        return data.prefetch(tf.data.AUTOTUNE)

    # ---- as a Keras callback: the training position (and a growing batch's learning rate) ---------------------
    def on_train_begin(self, logs=None) -> None:
        if not self.plan.growth:
            return
        rate = constant_learning_rate(self.model.optimizer)
        if not hasattr(self, "_base_lr"):  # a second fit (more epochs) scales from the first one's rate
            self._base_lr = float(np.asarray(rate))
        # Keras ends an epoch whose pass runs out with "Your input ran out of data; interrupting training": with a
        # growing batch every later epoch is shorter than the first by design, and training goes on.
        self._quiet = warnings.catch_warnings()
        self._quiet.__enter__()
        warnings.filterwarnings("ignore", message="Your input ran out of data")

    def on_train_end(self, logs=None) -> None:
        if getattr(self, "_quiet", None) is not None:
            self._quiet.__exit__(None, None, None)
            self._quiet = None

    def on_epoch_begin(self, epoch, logs=None) -> None:
        self.set_epoch(epoch)
        if self.plan.growth:
            factor = self.plan.batch_size_at(epoch) / self.plan.batch_size
            constant_learning_rate(self.model.optimizer).assign(grown_lr(self._base_lr, factor, self.growth_lr))

    def on_train_batch_end(self, batch, logs=None) -> None:
        # `batch` is the index of the last batch run (with steps_per_execution > 1, of several); a step counts as
        # consumed once all its micro-batches have run.
        after = self.step_ends()
        done = min((batch + 1) // self.plan.accumulate, len(after))
        if done:
            self.consumed = int(after[done - 1])

    def on_epoch_end(self, epoch, logs=None) -> None:
        self.consumed = self.plan.dataset_size


def _allgather(values: np.ndarray) -> np.ndarray:
    return hvd.allgather(tf.reshape(tf.constant(values), (1, -1)), name="hvdsync.shares").numpy()


class ShardedLoader(PlanLoader):
    """This rank's planned steps as a ``tf.data.Dataset``: one element per optimizer step.

    An element is a tuple of ``plan.accumulate`` ``(x, y)`` micro-batches plus the step's ``global_count`` (what
    :func:`hvdsync.tensorflow.loss_scale` needs). Micro-batches on the last step may be smaller, even empty, so
    the batch dimension is ``None``. Every rank gets the same number of steps and micro-batches, so collectives never
    wait on a rank that ran out of data. Iterating the loader itself yields ``(micro_batches, step)`` pairs, like
    :class:`hvdsync.torch.ShardedLoader`; call ``set_epoch(e)`` before each epoch.

    Example:
        >>> loader = ShardedLoader(x, y, ShardPlan(len(x), hvd.size(), 32), hvd.rank())  # doctest: +SKIP
        >>> for micro, global_count in loader.dataset(): ...                             # doctest: +SKIP
    """

    def dataset(self, epoch: int | None = None) -> tf.data.Dataset:
        """The steps of ``epoch`` (default: the one ``set_epoch`` chose), prefetched one step ahead."""
        return self._pipeline(self.steps(epoch))

    def __iter__(self) -> Iterator[tuple[list[tuple[tf.Tensor, tf.Tensor]], Step]]:
        steps = self.steps()
        for (micro, _), step in zip(self._pipeline(steps), steps):
            yield list(micro), step

    def _pipeline(self, steps: list[Step]) -> tf.data.Dataset:
        pair = (tf.TensorSpec((None,) + self.x.shape[1:], tf.as_dtype(self.x.dtype)),
                tf.TensorSpec((None,) + self.y.shape[1:], tf.as_dtype(self.y.dtype)))

        def gather():
            for step in steps:
                yield tuple((self.x[i], self.y[i]) for i in step.micro), step.global_count

        signature = (tuple(pair for _ in range(self.plan.accumulate)), tf.TensorSpec((), tf.int64))
        return tf.data.Dataset.from_generator(gather, output_signature=signature).prefetch(1)
