"""``sync.mode: gossip`` for Keras 3: mix the trainable variables with the ring neighbours', then a local update
(mirrors ``hvdsync/torch/schemes/gossip.py``)."""
from __future__ import annotations

import horovod.tensorflow as hvd
import keras
import tensorflow as tf

from hvdsync.config import SyncConfig
from hvdsync.core.comm.codecs import WireCounter
from hvdsync.core.comm.codecs.base import Codec
from hvdsync.core.comm.schemes import gossip
from hvdsync.tensorflow.compression import record_all_on_wire
from hvdsync.tensorflow.schemes.base import DistributedOptimizer


class GossipOptimizer(DistributedOptimizer):
    """``sync.mode: gossip``: every ``sync.period`` updates, mix the trainable variables with the ring neighbours'
    (Metropolis weights, :func:`hvdsync.core.comm.schemes.gossip.mixing_matrix`; one ``hvd.alltoall``), then take
    the local update on the local gradient sum. The same order as PyTorch's: the mixing comes before the update of
    the same step, the first step mixes.

    With ``track_consensus = True`` it also all-reduces the parameters before and after each mixing to record the
    consensus distance in :attr:`consensus` (extra traffic, for measurements only; not counted in :attr:`traffic`;
    eager mixing only, as the lab's comparisons run it).
    """

    _phases_in_apply = True  # its synchronize() carries the mixing schedule

    def __init__(self, optimizer: keras.optimizers.Optimizer, sync: SyncConfig, codec: Codec,
                 counter: WireCounter | None = None, seed: int = 0, name: str | None = None) -> None:
        super().__init__(optimizer, sync, codec, counter, seed, name=name or f"gossip_{optimizer.name}")
        self.rank, self.size = hvd.rank(), hvd.size()
        self.neighbours = gossip.neighbours(self.rank, self.size)
        self.weights = gossip.mixing_matrix(self.size)[self.rank]
        self.track_consensus = False
        self.consensus: list[tuple[int, float, float]] = []

    def build(self, var_list) -> None:
        super().build(var_list)
        self.numel = sum(int(v.shape.num_elements()) for v in self._trainable_variables)
        self.splits = gossip.exchange_splits(self.numel, self.rank, self.size)
        # Updates taken and what the exchanges moved: optimizer variables, counted as they run (also in a graph).
        self._local_steps = self.add_variable(shape=(), dtype="int64", name="hvdsync_local_steps")
        self._rounds = self.add_variable(shape=(), dtype="int64", name="hvdsync_rounds")
        self._moved = self.add_variable(shape=(), dtype="int64", name="hvdsync_bytes_each_way")

    @property
    def rounds(self) -> int:
        """Mixings issued so far."""
        return int(self._rounds.numpy())

    @property
    def traffic(self) -> dict:
        """Bytes this rank sent and received through the exchanges (the same each way), and the rounds."""
        moved = int(self._moved.numpy())
        return {"sent": moved, "received": moved, "rounds": self.rounds}

    def _flat(self) -> tf.Tensor:
        return tf.concat([tf.reshape(v.value, [-1]) for v in self._trainable_variables], axis=0)

    def consensus_distance(self) -> float:
        """sqrt(mean over ranks of ||x_r - mean x||^2), through two all-reduces (every rank must call it)."""
        x = tf.cast(self._flat(), tf.float64)
        mean = hvd.allreduce(x, op=hvd.Average, name="hvdsync.gossip.mean")
        sq = hvd.allreduce(tf.reshape(tf.reduce_sum((x - mean) ** 2), [1]), op=hvd.Average,
                           name="hvdsync.gossip.distance")
        return float(tf.sqrt(sq)[0])

    def mix(self) -> None:
        """One gossip round now: this rank's trainable variables become the weighted average with its neighbours'
        (every rank must call it)."""
        x = self._flat()
        outgoing = tf.tile(x, [len(self.neighbours)])            # one copy per neighbour, in destination order
        record_all_on_wire(self.counter, [outgoing])
        received, _ = hvd.alltoall(outgoing, splits=tf.constant(self.splits, tf.int32),
                                   name="hvdsync.gossip.exchange")
        mixed = float(self.weights[self.rank]) * x
        for i, j in enumerate(self.neighbours):                   # received chunks come in source-rank order
            mixed += float(self.weights[j]) * received[i * self.numel:(i + 1) * self.numel]
        offset = 0
        for v in self._trainable_variables:
            n = int(v.shape.num_elements())
            v.assign(tf.reshape(mixed[offset:offset + n], v.shape))
            offset += n
        self._moved.assign_add(len(self.neighbours) * self.numel * x.dtype.size)
        self._rounds.assign_add(1)

    def synchronize(self) -> None:
        """Mix when the schedule says so (every ``sync.period``-th update, the first included); the gradients stay
        local."""
        if not self.neighbours:
            return
        due = tf.equal(self._local_steps % self.sync.period, 0)
        if self.track_consensus and tf.executing_eagerly():
            if bool(due):
                before = self.consensus_distance()
                self.mix()
                self.consensus.append((int(self._local_steps.numpy()), before, self.consensus_distance()))
            return

        def mix() -> tf.Tensor:
            self.mix()
            return tf.constant(True)

        tf.cond(due, mix, lambda: tf.constant(False))

    def step(self, clear: bool = True) -> None:
        """The local update on this rank's own gradient sum."""
        super().step(clear)
        self._local_steps.assign_add(1)
