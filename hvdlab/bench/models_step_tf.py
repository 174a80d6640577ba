"""The Keras contenders of ``benchmarks/models.py``, run inside their workers: hvdsync's adapter API, TensorFlow's
``MultiWorkerMirroredStrategy`` (MWMS), and the model's compute alone (the PyTorch ones:
:mod:`hvdlab.bench.models_step`).

The same timed region as there: the clock starts before the step's batch is made and turned into tensors (the data
fetch) and stops when the update has run; the step itself is one ``tf.function`` on every side (a custom loop, the
loop hvdsync's adapter API and MWMS both document). A step's time is the slowest rank's. Each worker reads from
inside its affinity and TensorFlow's intra-op threads (:func:`hvdlab.bench.link_fair.placement`) and its inter-op
threads (``tf.config.threading.get_inter_op_parallelism_threads``), not the values asked for.

* ``hvdsync``: ``hvdsync.tensorflow.init``, ``distributed_optimizer`` (the codec under test) around Keras' SGD, and
  ``broadcast_state``, in Horovod workers from :func:`hvdsync.launch.run`;
* ``mwms``: ``MultiWorkerMirroredStrategy`` with ring collectives over gRPC (``TF_CONFIG``: every rank's address),
  each rank's loss divided by the replicas (the strategy sums their gradients); the intra- and inter-op threads set
  to hvdsync's rule's before any op, as hvdsync's init sets them;
* ``compute``: one process, no synchronisation.
"""
from __future__ import annotations

import json
import os
import time

CODECS = ("none", "fp16")   # MWMS' counterpart of fp16: CommunicationOptions has none; rows of fp16 set hvdsync's
# fp16 against MWMS' fp32, and say so (contender_codec).


def _threads(n: int) -> None:
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(n)
    tf.config.threading.set_inter_op_parallelism_threads(n)


def _where() -> dict:
    import tensorflow as tf

    from hvdlab.bench.link_fair import placement

    return {**placement("tensorflow"), "inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads()}


def _timed(apply, spec: dict, rank: int, world: int) -> list[float]:
    import tensorflow as tf

    from hvdlab.tensorflow import real_models

    times = []
    for i in range(spec["warmup"] + spec["steps"]):
        t0 = time.perf_counter()
        b = {k: tf.constant(v) for k, v in real_models.batch(
            spec["model"], spec["size"], spec["batch"], seed=spec["seed"] * 100_003 + i * world + rank).items()}
        apply(b)
        times.append(time.perf_counter() - t0)
    return times[spec["warmup"]:]


def _sgd(spec: dict):
    import keras

    return keras.optimizers.SGD(spec.get("lr", 0.01), momentum=0.9)


def _slowest(per_rank: list[list[float]]) -> list[float]:
    return [max(ts) for ts in zip(*per_rank)]


def hvdsync_worker(spec: dict) -> dict:
    import horovod.tensorflow as hvd

    import hvdsync.tensorflow as hs
    from hvdlab.tensorflow import real_models
    from hvdsync.config import Config

    cfg = Config.from_dict({"sync": {"compression": spec["codec"]},
                            "train": {"framework": "tensorflow", "seed": spec["seed"], "device": "cpu"}})
    info = hs.init(cfg)   # before any op: it sets the threads per worker
    import tensorflow as tf

    model = real_models.build(spec["model"], spec["size"])
    opt = hs.distributed_optimizer(_sgd(spec), model, cfg.sync)
    hs.broadcast_state(model, opt)

    @tf.function
    def apply(b):
        with tf.GradientTape() as tape:
            loss = real_models.loss(spec["model"], model, b)
        opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)

    times = _timed(apply, spec, info.rank, info.size)
    gathered = hvd.allgather_object({"times": times, "placement": _where()})
    return {"steps_s": _slowest([g["times"] for g in gathered]), "placement": [g["placement"] for g in gathered]}


def mwms_worker(rank: int, addresses: list[str], spec: dict, threads: int) -> dict:
    """One rank of MWMS; ``addresses``: every rank's ``host:port``, in rank order. Returns this rank's step times
    (the runner takes the slowest rank's per step) and placement."""
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": addresses}, "task": {"type": "worker", "index": rank}})
    _threads(threads)
    import tensorflow as tf

    from hvdlab.tensorflow import real_models

    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING))
    with strategy.scope():
        tf.keras.utils.set_random_seed(spec["seed"])
        model = real_models.build(spec["model"], spec["size"])
        opt = _sgd(spec)
        opt.build(model.trainable_variables)

    def replica_step(b):
        with tf.GradientTape() as tape:
            loss = real_models.loss(spec["model"], model, b) / strategy.num_replicas_in_sync
        opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)

    @tf.function
    def apply(b):
        strategy.run(replica_step, args=(b,))

    # This rank's own times: the runner reads every rank's and takes the slowest per step.
    return {"steps_s": _timed(apply, spec, rank, len(addresses)), "placement": [_where()]}


def compute_worker(spec: dict, threads: int) -> dict:
    _threads(threads)
    import tensorflow as tf

    from hvdlab.tensorflow import real_models

    model = real_models.build(spec["model"], spec["size"])
    opt = _sgd(spec)

    @tf.function
    def apply(b):
        with tf.GradientTape() as tape:
            loss = real_models.loss(spec["model"], model, b)
        opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)

    times = _timed(apply, spec, 0, 1)
    params, tensors = real_models.gradient_tensors(model)
    return {"steps_s": times, "parameters": params, "tensors": tensors, "placement": [_where()]}
