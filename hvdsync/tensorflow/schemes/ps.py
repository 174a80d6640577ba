"""``sync.mode: ps`` for Keras 3: push gradients to the shard owners, update at the owner, pull the parameters
(mirrors ``hvdsync/torch/schemes/ps.py``, on the same plan: :mod:`hvdsync.core.comm.schemes.ps`)."""
from __future__ import annotations

import horovod.tensorflow as hvd
import keras
import tensorflow as tf

from hvdsync.config import SyncConfig
from hvdsync.core.comm.codecs import WireCounter
from hvdsync.core.comm.codecs.base import Codec
from hvdsync.core.comm.schemes.ps import push_bytes, push_splits, server_count
from hvdsync.core.comm.traffic import chunk_bounds
from hvdsync.tensorflow.compression import TFOps, record_all_on_wire
from hvdsync.tensorflow.schemes.base import DistributedOptimizer


def push(flat: tf.Tensor, splits: list[int], rank: int, name: str) -> tf.Tensor:
    """The push of a parameter-server round: every rank sends ``splits[j]`` consecutive elements of ``flat`` to rank
    j (one ``hvd.alltoall``) and each owner adds the W pieces of its shard it received (ranks with
    ``splits[rank] == 0`` own nothing and get an empty tensor). Returns this rank's summed shard.

    Not ``hvd.reducescatter``, for the reasons :func:`hvdsync.torch.schemes.ps.push` gives (Horovod 0.28.1's Gloo
    reduce-scatter races on its own buffer and is slower); the alltoall moves the same bytes.

    Example:
        >>> push(flat, push_splits(int(tf.size(flat)), hvd.size(), 0), hvd.rank(), "grads")  # doctest: +SKIP
    """
    mine = splits[rank]
    received, _ = hvd.alltoall(flat, splits=tf.constant(splits, tf.int32), name=name)
    if not mine:
        return received[:0]
    # Rows in source-rank order: the same order of additions on every owner, whatever the timing.
    return tf.reduce_sum(tf.reshape(received, [len(splits), mine]), axis=0)


class ParameterServerOptimizer(DistributedOptimizer):
    """``sync.mode: ps`` for Keras 3: push gradients to the shard owners, update at the owner, pull the parameters.

    Rank j < k owns the j-th contiguous shard of the flattened trainable variables (k = ``sync.ps_servers``, 0 =
    every rank) and keeps the optimizer state of that shard only: a new optimizer of the user's class and settings
    (``from_config``) over one flat variable of this rank's length (element-wise optimizers: SGD, Adam, RMSprop,
    ...). The wrapped optimizer stays what Keras' callbacks and schedules see: its learning rate is copied in and
    its ``iterations`` is the shard optimizer's clock every step, and every rank steps (a rank that owns nothing on
    an empty shard), so ``iterations`` is equal everywhere.

    :attr:`variables` lists what is the same on every rank (the gradient sums, the counters, the wrapped
    optimizer's ``iterations`` and learning rate): :func:`~hvdsync.tensorflow.broadcast_state` broadcasts it by
    position, which shards of other lengths would break. The sharded state is :attr:`shard_variables`, per rank;
    Keras checkpoints of the optimizer hold the replicated part only, and the config refuses ``sync.mode: ps`` with
    elastic training in TensorFlow (PyTorch's optimizer gathers and re-cuts its state; this one does not yet).

    Args:
        optimizer: the user's Keras optimizer, not built yet (element-wise: SGD, Adam, RMSprop, ...).
        sync: the checked settings: ``ps_servers``, ``op`` (``average`` or ``sum`` of the pushes), ``compression``
            (``none`` or ``fp16`` on the push), ``accumulate`` (backward passes summed locally per push).
        codec: the codec built from ``sync.compression``.
        counter: records every tensor handed to Horovod in the push.
    """

    _phases_in_apply = True  # its synchronize() and step() are the push and the update + pull, also at accumulate 1

    def __init__(self, optimizer: keras.optimizers.Optimizer, sync: SyncConfig, codec: Codec,
                 counter: WireCounter | None = None, seed: int = 0, name: str | None = None) -> None:
        super().__init__(optimizer, sync, codec, counter, seed, name=name or f"ps_{optimizer.name}")
        self.rank, self.size = hvd.rank(), hvd.size()
        if not 0 <= sync.ps_servers <= self.size:
            raise ValueError(f"sync.ps_servers: {sync.ps_servers!r} is not allowed with {self.size} workers; "
                             f"expected 0 to {self.size}")
        self.ops = TFOps()

    def build(self, var_list) -> None:
        var_list = list(var_list)
        self.numel = sum(int(v.shape.num_elements()) for v in var_list)
        self.servers = server_count(self.size, self.sync.ps_servers)
        self.splits = push_splits(self.numel, self.size, self.sync.ps_servers)
        self.lo, self.hi = chunk_bounds(self.numel, self.servers)[self.rank] if self.rank < self.servers else (0, 0)
        dtype = var_list[0].dtype if var_list else "float32"
        # Set past Keras' attribute tracking (object.__setattr__): a tracked variable would join self.variables,
        # and these have a different length on every rank. The shard holds the parameters between the re-read at
        # the step's start and the pull; the gradient carries the pushed sum from synchronize() to step(), which
        # the training loop runs as two graphs.
        object.__setattr__(self, "_shard", keras.Variable(tf.zeros([self.hi - self.lo], dtype), trainable=False,
                                                          name="hvdsync_ps_shard"))
        object.__setattr__(self, "_shard_grad", keras.Variable(tf.zeros([self.hi - self.lo], dtype),
                                                               trainable=False, name="hvdsync_ps_shard_grad"))
        inner = self.inner_optimizer
        shard_optimizer = type(inner).from_config(inner.get_config())
        shard_optimizer.build([self._shard])
        object.__setattr__(self, "_shard_optimizer", shard_optimizer)
        clock = {id(v) for v in (shard_optimizer.iterations, shard_optimizer.learning_rate)}
        object.__setattr__(self, "_sharded", [self._shard, self._shard_grad] + [
            v for v in shard_optimizer.variables if id(v) not in clock])
        super().build(var_list)  # the gradient sums
        # Counted as they run (also inside a graph): optimizer variables, as gossip's and local SGD's counters.
        self._sent = self.add_variable(shape=(), dtype="int64", name="hvdsync_bytes_sent")
        self._received = self.add_variable(shape=(), dtype="int64", name="hvdsync_bytes_received")
        self._rounds = self.add_variable(shape=(), dtype="int64", name="hvdsync_rounds")

    @property
    def variables(self) -> list:
        # The wrapped optimizer's slots (built over the whole model, e.g. by local_optimizer) are never used here.
        inner = self.inner_optimizer
        return self._variables[:] + [v for v in (inner.iterations, inner.learning_rate) if isinstance(v, keras.Variable)]

    @property
    def shard_variables(self) -> list:
        """This rank's shard of the parameters, the pushed gradient and the shard optimizer's slots for them."""
        return list(self._sharded)

    @property
    def rounds(self) -> int:
        """Push + pull rounds issued so far."""
        return int(self._rounds.numpy())

    @property
    def traffic(self) -> dict:
        """Bytes this rank sent and received through the push and the pull, and the rounds."""
        return {"sent": int(self._sent.numpy()), "received": int(self._received.numpy()), "rounds": self.rounds}

    def _flat(self) -> tf.Tensor:
        return tf.concat([tf.reshape(v.value, [-1]) for v in self._trainable_variables], axis=0)

    def synchronize(self) -> None:
        """Push the summed gradients to the shard owners; an owner keeps the sum (or mean) of its shard."""
        flat = tf.concat([tf.reshape(s.value, [-1]) for s in self._grad_sums], axis=0)
        wire = self.codec.encode(self.ops, flat)  # fp16 on the wire with sync.compression fp16
        record_all_on_wire(self.counter, [wire], len(self._grad_sums))
        itemsize = wire.dtype.size
        mine = self.splits[self.rank]
        reduced = self.codec.decode(self.ops, push(wire, self.splits, self.rank, "hvdsync.ps.push"), flat.dtype.name)
        self._shard_grad.assign(reduced / self.size if self.sync.op == "average" else reduced)
        sent, received = push_bytes(self.numel, mine, self.size, itemsize)
        self._sent.assign_add(sent)
        self._received.assign_add(received)

    def step(self, clear: bool = True) -> None:
        """Update the owned shard with the wrapped optimizer and pull every shard back into the variables."""
        # The parameters equal the last pull; re-reading them also picks up a broadcast or a loaded checkpoint.
        self._shard.assign(self._flat()[self.lo:self.hi])
        # The wrapped optimizer's settings apply at the owner: its learning rate (a Keras callback may have set it)
        # and its clock (a schedule's argument; restored with a checkpoint). Every rank applies, an empty shard
        # included, so iterations moves alike everywhere.
        inner, shard_optimizer = self.inner_optimizer, self._shard_optimizer
        if isinstance(shard_optimizer.learning_rate, keras.Variable):
            shard_optimizer.learning_rate.assign(inner.learning_rate)
        shard_optimizer.iterations.assign(inner.iterations)
        shard_optimizer.apply([self._shard_grad.value], [self._shard])
        inner.iterations.assign_add(1)
        itemsize = tf.as_dtype(self._shard.dtype).size
        mine = self.hi - self.lo
        if self.servers == 1:
            # Rank 0 owns all; the others hand Horovod a tensor of the same shape, which the broadcast overwrites.
            source = self._shard.value if self.rank == 0 else self._flat()
            flat = hvd.broadcast(source, root_rank=0, name="hvdsync.ps.pull")
        else:
            flat = hvd.allgather(self._shard.value, name="hvdsync.ps.pull")  # shards arrive in rank order
        offset = 0
        for v in self._trainable_variables:
            n = int(v.shape.num_elements())
            v.assign(tf.reshape(flat[offset:offset + n], v.shape))
            offset += n
        received, sent = push_bytes(self.numel, mine, self.size, itemsize)   # the pull: the push's mirror
        self._sent.assign_add(sent)
        self._received.assign_add(received)
        self._rounds.assign_add(1)
        if clear:
            self.clear()
