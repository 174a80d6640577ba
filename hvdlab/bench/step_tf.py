"""The TensorFlow (Keras 3) training-step contenders (run inside workers started by ``training.py``).

The same work as :mod:`step_torch`, each step one ``tf.function`` call (SGD, cross-entropy on logits):

* ``single``: one process, no distribution, the whole global batch per step (the reference);
* ``raw``: raw Horovod, low level: ``hvd.grouped_allreduce`` of the gradients inside the ``tf.function`` (Horovod's
  own Keras helpers fail on Keras 3 variables);
* ``mwms``: ``tf.distribute.MultiWorkerMirroredStrategy`` (2 processes, ``TF_CONFIG``, gRPC and ring collectives);
* ``api``: hvdsync's Keras optimizer (``hvdsync.tensorflow.distributed_optimizer``) in the same ``tf.function``;
* ``fit``: ``hvdsync.tensorflow.fit`` with the model and loss handed in (the shared loop drives the steps).
"""
from __future__ import annotations

import os

from hvdlab.bench.step_common import (Spec, Work, data, fingerprint, fit_config, plan, start_values, step_clock,
                                      timed_steps, wrong)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _threads(n: int) -> None:
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(n)
    tf.config.threading.set_inter_op_parallelism_threads(n)


def model(work: Work):
    import keras

    if work.model == "mlp":
        m = keras.Sequential([keras.Input((work.features,)), keras.layers.Dense(work.hidden, activation="relu"),
                              keras.layers.Dense(work.hidden, activation="relu"), keras.layers.Dense(work.classes)])
    else:
        from hvdsync.tensorflow.models import CNN

        m = CNN(work.classes, width=work.hidden)
        m(keras.ops.zeros((1, *work.input_shape())))
    variables = m.trainable_variables
    for v, value in zip(variables, start_values([tuple(v.shape) for v in variables], "last_out")):
        if value is not None:
            v.assign(value)
    return m


def _ce(y, logits):
    import keras
    import tensorflow as tf

    return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))


def _params(m) -> list:
    return [v.numpy() for v in m.trainable_variables]


def _loop(spec: Spec, m, apply_fn, rank: int) -> list[float]:
    """Each micro-batch one traced call of ``apply_fn(x, y, weight)``; ``weight`` is the micro-batch's share of
    this rank's samples (1 without accumulation)."""
    import tensorflow as tf

    work = Work(**spec.work)
    x, y = data(work)
    accumulate = (spec.sync or {}).get("accumulate", 1)
    steps = plan(work, spec.world, accumulate).epoch(0, rank)
    fn = tf.function(apply_fn, input_signature=[tf.TensorSpec((None, *work.input_shape()), tf.float32),
                                                tf.TensorSpec((None,), tf.int64)])

    def step(s):
        for idx in s.micro:
            fn(x[idx], y[idx])

    return timed_steps(step, steps, work.warmup)


def plain_worker(spec: dict, rank: int, world: int, port: int) -> dict:
    """``single`` (world 1) and ``mwms`` (``port``: the first of two consecutive free ports)."""
    spec = Spec(**spec)
    work = Work(**spec.work)
    if spec.kind == "mwms":
        import json

        os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": [f"127.0.0.1:{port + i}" for i in range(world)]},
                                              "task": {"type": "worker", "index": rank}})
    _threads(spec.threads)
    import keras
    import tensorflow as tf

    if spec.kind == "single":
        m = model(work)
        start = fingerprint(_params(m))
        opt = keras.optimizers.SGD(work.lr)
        opt.build(m.trainable_variables)

        def apply(x, y):
            with tf.GradientTape() as tape:
                loss = _ce(y, m(x, training=True))
            opt.apply(tape.gradient(loss, m.trainable_variables), m.trainable_variables)

        times = _loop(spec, m, apply, 0)
        return {"times": times, "fingerprint": fingerprint(_params(m)), "start": start, "threads": spec.threads}
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING))
    with strategy.scope():
        m = model(work)
        opt = keras.optimizers.SGD(work.lr)
        opt.build(m.trainable_variables)

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            # This rank's mean divided by the replicas: the optimizer sums the replicas' gradients (the global mean).
            loss = _ce(y, m(x, training=True)) / strategy.num_replicas_in_sync
        opt.apply(tape.gradient(loss, m.trainable_variables), m.trainable_variables)

    times = _loop(spec, m, lambda x, y: strategy.run(replica_step, args=(x, y)), rank)
    return {"times": times, "fingerprint": fingerprint(_params(m)), "threads": spec.threads}


def horovod_worker(spec: dict) -> dict:
    """``raw``, ``api`` and ``fit``: inside Horovod workers from :func:`hvdsync.launch.local.run`."""
    spec = Spec(**spec)
    work = Work(**spec.work)
    knobs = {k: os.environ[k] for k in ("HOROVOD_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME", "HOROVOD_CACHE_CAPACITY",
                                        "HOROVOD_AUTOTUNE") if k in os.environ}
    if spec.kind == "raw":
        out = _raw(spec, work)
    elif spec.kind == "api":
        out = _api(spec, work)
    else:
        out = _fit(spec, work)
    import horovod.tensorflow as hvd

    hvd.shutdown()
    return {**out, "knobs": knobs}


def _raw(spec: Spec, work: Work) -> dict:
    import horovod.tensorflow as hvd

    hvd.init()
    _threads(spec.threads)
    import keras
    import tensorflow as tf

    m = model(work)
    opt = keras.optimizers.SGD(work.lr)
    opt.build(m.trainable_variables)
    for i, v in enumerate(m.trainable_variables):
        v.assign(hvd.broadcast(v.value, root_rank=0, name=f"start.{i}"))
    skip = wrong(spec.name)

    def apply(x, y):
        with tf.GradientTape() as tape:
            loss = _ce(y, m(x, training=True))
        grads = tape.gradient(loss, m.trainable_variables)
        if not skip:
            grads = hvd.grouped_allreduce(grads, op=hvd.Average)
        opt.apply(grads, m.trainable_variables)

    times = _loop(spec, m, apply, hvd.rank())
    return {"times": times, "fingerprint": fingerprint(_params(m)), "threads": spec.threads}


def _api(spec: Spec, work: Work) -> dict:
    import horovod.tensorflow as hvd

    import hvdsync.tensorflow as hs
    from hvdsync.config import Config, SyncConfig
    from hvdsync.core.comm.codecs import WireCounter

    sync = SyncConfig(**(spec.sync or {}))
    hs.init(Config(sync=sync))
    import keras
    import tensorflow as tf

    m = model(work)
    counter = WireCounter()
    opt = hs.distributed_optimizer(keras.optimizers.SGD(work.lr), m, sync, counter=counter)
    hs.broadcast_state(m, opt)
    counter.reset()

    def apply(x, y):
        # The optimizer averages the `accumulate` passes of one update (Keras' convention): each pass's mean loss.
        with tf.GradientTape() as tape:
            loss = _ce(y, m(x, training=True))
        opt.apply(tape.gradient(loss, m.trainable_variables), m.trainable_variables)

    times = _loop(spec, m, apply, hvd.rank())
    steps = work.warmup + work.steps
    n = len(m.trainable_variables)
    return {"times": times, "fingerprint": fingerprint(_params(m)), "threads": spec.threads,
            "bytes_per_step": counter.bytes / steps, "allreduce_rounds_per_step": counter.tensors / n / steps}


def _fit(spec: Spec, work: Work) -> dict:
    import hvdsync.tensorflow as hs
    from hvdsync.core.train.data import Dataset

    x, y = data(work)
    cfg = fit_config(spec, work)
    times, params = [], []
    # hvdsync's init sets the threads before TensorFlow's first op; the model is built after it (fit calls init
    # again, which keeps what is set).
    hs.init(cfg)
    import keras

    m = model(work)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    hs.fit(cfg, data=Dataset(x, y, x[:8], y[:8], work.classes), model=m, loss=loss,
           callbacks=[step_clock(work.warmup, times, params)])
    return {"times": times, "fingerprint": fingerprint(params), "threads": spec.threads}
