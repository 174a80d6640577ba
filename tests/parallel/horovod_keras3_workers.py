"""What tests/parallel/test_horovod_keras3.py runs inside 2 Horovod workers: Horovod's own TensorFlow 2 and Keras API
(hvd.DistributedGradientTape, horovod.tensorflow.keras / horovod.keras DistributedOptimizer and callbacks) over
Keras 3 models, as a user's unmodified script calls it, on hvdsync's patched Horovod build.

Each ``check_*`` runs on every rank, makes the same collective calls in the same order on both, and returns plain
numbers/arrays. A rank's "reference" is one process with plain Keras/TensorFlow and no Horovod call, on the global
batch (both ranks' shards), from the same initial weights: the distributed run must reproduce it.
"""
from __future__ import annotations

import numpy as np

N, FEATURES, HIDDEN, LR, SEED = 16, 4, 8, 0.1, 7


def _data(n: int = N, seed: int = SEED):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, FEATURES)).astype(np.float32)
    y = (x @ rng.normal(size=(FEATURES, 1)) + 0.1).astype(np.float32)
    return x, y


def _shard(a, rank: int, size: int):
    """Contiguous equal shards: the mean of the shards' mean losses is the global batch's mean loss."""
    per = len(a) // size
    return a[rank * per:(rank + 1) * per]


def _model(seed: int = SEED):
    import keras

    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(HIDDEN, activation="tanh"),
                              keras.layers.Dense(1)])
    rng = np.random.default_rng(seed)
    model.set_weights([rng.normal(scale=0.5, size=w.shape).astype(np.float32) for w in model.get_weights()])
    return model


def _weights(model) -> list[np.ndarray]:
    return [np.array(v.numpy()) for v in model.trainable_variables]


def _max_diff(a, b) -> float:
    return float(max(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))) for x, y in zip(a, b)))


def _mse(model, x, y):
    import tensorflow as tf

    return tf.reduce_mean(tf.square(model(x, training=True) - y))


def _tape_steps(model, x, y, steps: int, wrap=None):
    """Plain SGD steps with a GradientTape (``wrap`` makes it a Horovod tape)."""
    import tensorflow as tf

    for _ in range(steps):
        with tf.GradientTape() as tape:
            loss = _mse(model, x, y)
        if wrap is not None:
            tape = wrap(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        for v, g in zip(model.trainable_variables, grads):
            v.assign_sub(LR * tf.convert_to_tensor(g))
    return _weights(model)


def check_tape() -> dict:
    """hvd.DistributedGradientTape: dense fp32 and fp16, explicit groups, a process set, the partial tape."""
    import horovod.tensorflow as hvd

    rank, size = hvd.rank(), hvd.size()
    x, y = _data()
    xs, ys = _shard(x, rank, size), _shard(y, rank, size)
    out = {"start": _weights(_model())}
    out["reference"] = _tape_steps(_model(), x, y, 3)
    out["dense"] = _tape_steps(_model(), xs, ys, 3, hvd.DistributedGradientTape)
    out["fp16"] = _tape_steps(_model(), xs, ys, 3,
                              lambda t: hvd.DistributedGradientTape(t, compression=hvd.Compression.fp16))
    model = _model()
    groups = [[model.trainable_variables[0], model.trainable_variables[2]]]  # two of four in one group
    out["groups"] = _tape_steps(model, xs, ys, 3, lambda t: hvd.DistributedGradientTape(t, groups=groups))
    # Process sets (dynamic: added by every rank, in the same order). [0, 1] is the global set, passed explicitly;
    # {0} and {1}: each rank alone, so its gradient is its own shard's.
    out["process_set_global"] = _tape_steps(_model(), xs, ys, 3,
                                            lambda t: hvd.DistributedGradientTape(t, process_set=hvd.global_process_set))
    sets = [hvd.add_process_set([r]) for r in range(size)]
    out["process_set_alone"] = _tape_steps(_model(), xs, ys, 3,
                                           lambda t: hvd.DistributedGradientTape(t, process_set=sets[rank]))
    out["local_only"] = _tape_steps(_model(), xs, ys, 3)
    # the Keras optimizer on the one-rank set: SGD steps on the rank's own gradient
    import horovod.tensorflow.keras as hk
    import keras
    import tensorflow as tf

    model = _model()
    opt = hk.DistributedOptimizer(keras.optimizers.SGD(LR), process_set=sets[rank])
    for _ in range(3):
        with tf.GradientTape() as tape:
            loss = _mse(model, xs, ys)
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    out["optimizer_process_set_alone"] = _weights(model)
    for process_set in sets:
        hvd.remove_process_set(process_set)
    # Partial tape: the first layer is local (its gradient, divided by the number of ranks, is not averaged).
    model = _model()
    with __import__("tensorflow").GradientTape() as tape:
        loss = _mse(model, xs, ys)
    partial = hvd.PartialDistributedGradientTape(tape, local_layers=[model.layers[0]])
    out["partial"] = [np.array(g) for g in partial.gradient(loss, model.trainable_variables)]
    model = _model()
    with __import__("tensorflow").GradientTape() as tape:
        loss = _mse(model, xs, ys)
    out["partial_own"] = [np.array(g) for g in tape.gradient(loss, model.trainable_variables)]
    model = _model()
    with __import__("tensorflow").GradientTape() as tape:
        loss = _mse(model, x, y)
    out["partial_global"] = [np.array(g) for g in tape.gradient(loss, model.trainable_variables)]
    return out


def _embedding_model():
    import keras

    model = keras.Sequential([keras.Input((3,), dtype="int32"), keras.layers.Embedding(10, 4),
                              keras.layers.Flatten(), keras.layers.Dense(1)])
    rng = np.random.default_rng(SEED)
    model.set_weights([rng.normal(size=w.shape).astype(np.float32) for w in model.get_weights()])
    return model


def check_sparse() -> dict:
    """An Embedding's IndexedSlices gradient through the tape, allgathered (sparse) or densified (sparse_as_dense),
    and through the Keras optimizer with sparse_as_dense."""
    import horovod.tensorflow as hvd
    import horovod.tensorflow.keras as hk
    import keras
    import tensorflow as tf

    rank, size = hvd.rank(), hvd.size()
    rng = np.random.default_rng(SEED)
    ids = rng.integers(0, 10, size=(N, 3)).astype(np.int32)
    y = rng.normal(size=(N, 1)).astype(np.float32)
    ids_s, y_s = _shard(ids, rank, size), _shard(y, rank, size)
    out = {"reference": _tape_steps(_embedding_model(), ids, y, 2)}
    kinds = []

    def sparse(tape):
        wrapped = hvd.DistributedGradientTape(tape)
        real = wrapped.gradient

        def gradient(loss, variables):
            grads = real(loss, variables)
            kinds.append(type(grads[0]).__name__)
            return grads
        wrapped.gradient = gradient
        return wrapped

    out["sparse"] = _tape_steps(_embedding_model(), ids_s, y_s, 2, sparse)
    out["sparse_kinds"] = kinds
    out["sparse_as_dense"] = _tape_steps(_embedding_model(), ids_s, y_s, 2,
                                         lambda t: hvd.DistributedGradientTape(t, sparse_as_dense=True))
    model = _embedding_model()
    model.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(LR), sparse_as_dense=True), loss="mse")
    model.fit(ids_s, y_s, batch_size=len(ids_s), epochs=2, shuffle=False, verbose=0)
    out["keras_sparse_as_dense"] = _weights(model)
    del tf
    return out


def _fit(optimizer, x, y, batch_size: int, epochs: int = 2, callbacks=(), model=None):
    model = model or _model()
    model.compile(optimizer=optimizer, loss="mse")
    history = model.fit(x, y, batch_size=batch_size, epochs=epochs, shuffle=False, verbose=0,
                        callbacks=list(callbacks))
    return model, history


def check_optimizer() -> dict:
    """DistributedOptimizer around Keras 3 optimizers in compile/fit and in a custom loop, for both Horovod Keras
    modules; backward_passes_per_step with and without averaging; local variables (PartialDistributedOptimizer)."""
    import horovod.keras as hkeras
    import horovod.tensorflow as hvd
    import horovod.tensorflow.keras as hk
    import keras
    import tensorflow as tf

    rank, size = hvd.rank(), hvd.size()
    x, y = _data()
    xs, ys = _shard(x, rank, size), _shard(y, rank, size)
    half = len(xs)
    out = {}
    for name, make in {"sgd": lambda: keras.optimizers.SGD(LR, momentum=0.9),
                       "adam": lambda: keras.optimizers.Adam(0.01)}.items():
        # 2 epochs of 2 steps: a global batch of 8 = 4 per rank
        out[f"{name}_fit"] = _weights(_fit(hk.DistributedOptimizer(make()), xs, ys, half // 2)[0])
        out[f"{name}_fit_keras"] = _weights(_fit(hkeras.DistributedOptimizer(make()), xs, ys, half // 2)[0])
        order = np.concatenate([np.concatenate([_shard(x, r, size)[s * 4:(s + 1) * 4] for r in range(size)])
                                for s in range(2)])
        order_y = np.concatenate([np.concatenate([_shard(y, r, size)[s * 4:(s + 1) * 4] for r in range(size)])
                                  for s in range(2)])
        out[f"{name}_reference"] = _weights(_fit(make(), order, order_y, 8)[0])
    # custom loop: apply_gradients on a wrapped Adam
    model, opt = _model(), hk.DistributedOptimizer(keras.optimizers.Adam(0.01))
    ref_model, ref_opt = _model(), keras.optimizers.Adam(0.01)
    for _ in range(3):
        with tf.GradientTape() as tape:
            loss = _mse(model, xs, ys)
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        with tf.GradientTape() as tape:
            loss = _mse(ref_model, x, y)
        ref_opt.apply_gradients(zip(tape.gradient(loss, ref_model.trainable_variables),
                                    ref_model.trainable_variables))
    out["loop"], out["loop_reference"] = _weights(model), _weights(ref_model)

    # backward_passes_per_step=2: two passes of 4 samples per rank, one update, = one pass over the 16 samples.
    for average in (True, False):
        model = _model()
        opt = hk.DistributedOptimizer(keras.optimizers.SGD(LR), backward_passes_per_step=2,
                                      average_aggregated_gradients=average)
        seen = []
        for p in range(2):
            with tf.GradientTape() as tape:
                loss = _mse(model, xs[p * 4:(p + 1) * 4], ys[p * 4:(p + 1) * 4])
            opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
            seen.append(_weights(model))
        out[f"agg_{average}_after_pass"] = seen
        out[f"agg_{average}_iterations"] = int(opt.iterations.numpy())
        # the same one update from one process: SGD on the 16-sample batch (lr doubled without averaging:
        # the sum of 2 passes' mean gradients)
        ref = _model()
        _fit(keras.optimizers.SGD(LR if average else 2 * LR), x, y, len(x), epochs=1, model=ref)
        out[f"agg_{average}_reference"] = _weights(ref)
    # and in fit(): 2 epochs x 2 passes of 2 samples per rank = 2 updates, each over 8 global samples
    model, _ = _fit(hk.DistributedOptimizer(keras.optimizers.SGD(LR), backward_passes_per_step=2,
                                            average_aggregated_gradients=True), xs[:4], ys[:4], 2)
    out["agg_fit"] = _weights(model)
    both = np.concatenate([_shard(x, r, size)[:4] for r in range(size)])
    both_y = np.concatenate([_shard(y, r, size)[:4] for r in range(size)])
    out["agg_fit_reference"] = _weights(_fit(keras.optimizers.SGD(LR), both, both_y, len(both))[0])

    # local variables: PartialDistributedOptimizer (both modules), first layer local
    for module_name, module in (("tfkeras", hk), ("keras", hkeras)):
        model = _model()
        opt = module.PartialDistributedOptimizer(keras.optimizers.SGD(LR), local_layers=[model.layers[0]])
        with tf.GradientTape() as tape:
            loss = _mse(model, xs, ys)
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        out[f"partial_{module_name}"] = _weights(model)
    model = _model()
    with tf.GradientTape() as tape:
        loss = _mse(model, xs, ys)
    out["partial_own_grads"] = [np.array(g) for g in tape.gradient(loss, model.trainable_variables)]
    with tf.GradientTape() as tape:
        loss = _mse(model, x, y)
    out["partial_global_grads"] = [np.array(g) for g in tape.gradient(loss, model.trainable_variables)]
    out["start"] = _weights(_model())
    return out


def check_callbacks(tmp_dir: str) -> dict:
    """broadcast_variables and the callbacks: broadcast from different initial weights, metric averaging, the
    learning-rate warmup and schedule (the values the optimizer's variable holds at each batch), the best-model
    checkpoint with load_model; and SyncBatchNormalization."""
    import horovod.tensorflow as hvd
    import horovod.tensorflow.keras as hk
    import keras

    rank, size = hvd.rank(), hvd.size()
    x, y = _data()
    xs, ys = _shard(x, rank, size), _shard(y, rank, size)
    out = {}
    # broadcast_variables: different weights on each rank, rank 0's everywhere after
    model = _model(seed=100 + rank)
    out["bcast_before"] = _weights(model)
    hvd.broadcast_variables(model.variables, root_rank=0)
    out["bcast_after"] = _weights(model)

    class Record(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.epoch_logs, self.lrs = [], []

        def on_train_batch_begin(self, batch, logs=None):
            self.lrs.append(float(np.asarray(self.model.optimizer.learning_rate)))

        def on_epoch_end(self, epoch, logs=None):
            self.epoch_logs.append({k: float(v) for k, v in (logs or {}).items()})

    # BroadcastGlobalVariablesCallback + MetricAverageCallback: rank-dependent initial weights
    before, after = Record(), Record()
    model, _ = _fit(hk.DistributedOptimizer(keras.optimizers.SGD(LR, momentum=0.9)), xs, ys, 4,
                    callbacks=[hk.callbacks.BroadcastGlobalVariablesCallback(0), before,
                               hk.callbacks.MetricAverageCallback(), after], model=_model(seed=100 + rank))
    out["bcast_fit"] = _weights(model)
    out["metric_raw"] = [logs["loss"] for logs in before.epoch_logs]
    out["metric_averaged"] = [logs["loss"] for logs in after.epoch_logs]
    order = np.concatenate([np.concatenate([_shard(x, r, size)[s * 4:(s + 1) * 4] for r in range(size)])
                            for s in range(2)])
    order_y = np.concatenate([np.concatenate([_shard(y, r, size)[s * 4:(s + 1) * 4] for r in range(size)])
                              for s in range(2)])
    out["bcast_fit_reference"] = _weights(_fit(keras.optimizers.SGD(LR, momentum=0.9), order, order_y, 8,
                                               model=_model(seed=100))[0])

    # LearningRateWarmupCallback: 2 warmup epochs of 2 steps, then a third epoch at the initial lr
    rec = Record()
    _fit(hk.DistributedOptimizer(keras.optimizers.SGD(0.4)), xs, ys, 4, epochs=3,
         callbacks=[hk.callbacks.LearningRateWarmupCallback(initial_lr=0.4, warmup_epochs=2,
                                                            momentum_correction=False), rec])
    out["warmup_lrs"] = rec.lrs
    out["warmup_logged"] = [logs["lr"] for logs in rec.epoch_logs]
    # LearningRateScheduleCallback: x0.5 per epoch from epoch 1 (staircase), initial_lr taken from the optimizer
    rec = Record()
    _fit(hk.DistributedOptimizer(keras.optimizers.SGD(0.4)), xs, ys, 4, epochs=3,
         callbacks=[hk.callbacks.LearningRateScheduleCallback(initial_lr=0.4, multiplier=0.5, start_epoch=1,
                                                              momentum_correction=False), rec])
    out["schedule_lrs"] = rec.lrs

    # BestModelCheckpoint (rank 0 saves, as Horovod's examples do) and load_model wrapping the saved optimizer
    callbacks = [hk.callbacks.BroadcastGlobalVariablesCallback(0)]
    path = f"{tmp_dir}/best.keras"
    if rank == 0:
        callbacks.append(hk.callbacks.BestModelCheckpoint(monitor="loss", filepath=path))
    model, _ = _fit(hk.DistributedOptimizer(keras.optimizers.Adam(0.01)), xs, ys, 4, epochs=2, callbacks=callbacks)
    if rank == 0:
        loaded = hk.load_model(path)
        out["loaded_weights_diff"] = _max_diff(_weights(loaded), _weights(model))
        out["loaded_optimizer"] = [type(loaded.optimizer).__module__, type(loaded.optimizer).__name__,
                                   type(loaded.optimizer).__mro__[1].__module__]
        out["loaded_iterations"] = int(loaded.optimizer.iterations.numpy())

    # SyncBatchNormalization: batch statistics over both ranks' shards = one BatchNormalization on the global batch
    layer = hvd.SyncBatchNormalization(momentum=0.5)
    out["sync_bn_out"] = np.array(layer(xs, training=True))
    out["sync_bn_moving"] = [np.array(layer.moving_mean), np.array(layer.moving_variance)]
    ref = keras.layers.BatchNormalization(momentum=0.5)
    out["sync_bn_ref_out"] = _shard(np.array(ref(x, training=True)), rank, size)
    out["sync_bn_ref_moving"] = [np.array(ref.moving_mean), np.array(ref.moving_variance)]
    return out


def check_keras2_calls() -> dict:
    """What exists only in Keras 2 fails with one line that names the Keras 3 way."""
    import horovod.tensorflow.keras as hk
    import keras

    out = {}
    opt = hk.DistributedOptimizer(keras.optimizers.SGD(LR))
    for call, fn in {"get_gradients": lambda: opt.get_gradients(None, []),
                     "compute_gradients": lambda: opt.compute_gradients(None, []),
                     "legacy_opts": lambda: hk.load_model("model.keras", legacy_opts=True)}.items():
        try:
            fn()
            out[call] = None
        except Exception as e:  # noqa: BLE001 - the type and the message are what is checked
            out[call] = f"{type(e).__name__}: {e}"
    return out


def run_all(tmp_dir: str) -> dict:
    """Every check, in one worker process per rank (TensorFlow's import is the slow part)."""
    import horovod.tensorflow as hvd

    hvd.init()
    return {"rank": hvd.rank(), "size": hvd.size(), "tape": check_tape(), "sparse": check_sparse(),
            "optimizer": check_optimizer(), "callbacks": check_callbacks(tmp_dir),
            "keras2": check_keras2_calls()}
