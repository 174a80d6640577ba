"""What the TensorFlow parallel tests run inside 2 Horovod workers (one launch, many checks; numbers come back).

Each ``check_*`` runs on every rank, makes the same collective calls in the same order on both, and returns plain
numbers/arrays; the references ("one process, plain Keras") are computed on rank 0 only, with no Horovod call.
tests/parallel/test_tensorflow.py sends this module to the workers by value (cloudpickle) and asserts on the numbers.
"""
from __future__ import annotations

import numpy as np

# Small synthetic problem for the exact-equality checks: big enough to move the weights, quick to trace.
FEATURES, CLASSES, HIDDEN, LR, SEED = 10, 3, 16, 0.5, 3


def _config(batch_size: int, **sync):
    from hvdsync.config import Config

    return Config.from_dict({"sync": sync, "data": {"batch_size": batch_size},
                             "train": {"hidden": HIDDEN, "lr": LR, "momentum": 0.0, "seed": SEED},
                             "tracking": {"enabled": False}})


def _dataset(n: int):
    from hvdsync.core.train.data import Dataset

    rng = np.random.default_rng([SEED, n])
    x = rng.normal(size=(n, FEATURES)).astype(np.float32)
    y = rng.integers(0, CLASSES, size=n).astype(np.int64)
    return Dataset(x, y, x[:16], y[:16], CLASSES)


def _weights(model) -> list[np.ndarray]:
    return [np.array(v.numpy()) for v in model.trainable_variables]


def reference(init: list[np.ndarray], data, plan, epochs: int) -> list[np.ndarray]:
    """One process, plain Keras, no Horovod: SGD on global batches of ``plan.global_batch`` samples taken in the
    plan's global order (the same samples the ranks share out), mean loss per batch (Keras' default)."""
    import keras

    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(HIDDEN, activation="relu"),
                              keras.layers.Dense(CLASSES)])
    model.set_weights(init)
    model.compile(optimizer=keras.optimizers.SGD(LR), jit_compile=False,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    for epoch in range(epochs):
        order = plan.order(epoch)
        for lo in range(0, len(order), plan.global_batch):
            idx = order[lo:lo + plan.global_batch]
            model.train_on_batch(data.x_train[idx], data.y_train[idx])
    return _weights(model)


def _max_diff(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return float(max(np.max(np.abs(x - y)) for x, y in zip(a, b)))


def _mismatch(got, want) -> float:
    """Largest absolute difference between two arrays, 0.0 for two empty ones, inf where the shapes differ."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return float("inf")
    return float(np.max(np.abs(got.astype(np.float64) - want), initial=0.0))


def check_fit(n: int, batch_size: int, accumulate: int, epochs: int, compression: str = "none") -> dict:
    """The shared loop with the TensorFlow backend vs the plain-Keras reference on the same samples."""
    import horovod.tensorflow as hvd

    from hvdsync.core.train.callbacks import Callback
    from hvdsync.fitting import fit_loop
    from hvdsync.core.train._plan import ShardPlan
    from hvdsync.core.telemetry.tracking import Tracker
    from hvdsync.tensorflow import build, init

    cfg = _config(batch_size=batch_size, accumulate=accumulate, compression=compression)
    cfg = cfg.replace(train={"epochs": epochs})
    init(cfg)
    data = _dataset(n)
    backend = build(cfg, data)
    start = _weights(backend.model)  # rank 0's, after the broadcast
    before_last = []

    class KeepBefore(Callback):  # the parameters before each step: the last step's update is lr x its gradient
        def on_step_begin(self, ctx):
            before_last[:] = _weights(backend.model)

    result = fit_loop(cfg, backend, data, tracker=Tracker(), callbacks=[KeepBefore()])
    out = {"steps": result.optimizer_steps, "passes": result.backward_passes, "rounds": result.allreduce_rounds,
           "wire": result.wire, "spread": result.param_spread, "grad_tensors": backend.grad_tensors,
           "elements": sum(int(v.numpy().size) for v in backend.model.trainable_variables)}
    out["params"] = params = _weights(backend.model)
    # grad_norm() is computed when asked, after the update: it must still see the last step's reduced gradient.
    lr = float(np.asarray(backend.optimizer.learning_rate))
    out["grad_norm"] = backend.grad_norm()
    out["update_norm"] = float(np.sqrt(sum(np.sum((a - b) ** 2) for a, b in zip(before_last, params)))) / lr
    if hvd.rank() == 0:
        plan = ShardPlan(n, hvd.size(), batch_size, accumulate, SEED, True)
        ref = reference(start, data, plan, epochs)
        out.update(max_diff=_max_diff(params, ref), moved=_max_diff(params, start))
    return out


# check_phases: rank 1 starts every step this much later than rank 0.
LATE_S = 0.05


def check_phases(n: int = 160, batch_size: int = 8, warmup: int = 2) -> dict:
    """``fit``'s step runs its pass, all-reduce and update as one graph and times the phases by the graph's clock
    reads. Rank 1 starts every step ``LATE_S`` late (asleep before it): rank 0 must see that as ``sync_wait``
    (inside its all-reduce), not as compute or update. Phase seconds of the steps after ``warmup`` (the first
    call traces the graph)."""
    import time

    import horovod.tensorflow as hvd

    from hvdsync.core.train.callbacks import Callback
    from hvdsync.fitting import fit_loop
    from hvdsync.core.telemetry.profiling import PHASES
    from hvdsync.core.telemetry.tracking import Tracker
    from hvdsync.tensorflow import build, init

    cfg = _config(batch_size=batch_size).replace(train={"epochs": 1})
    init(cfg)
    data = _dataset(n)
    backend = build(cfg, data)
    marks = {}

    class Late(Callback):
        def on_step_begin(self, ctx):
            if hvd.rank() == 1:
                time.sleep(LATE_S)

        def on_step_end(self, ctx):
            if ctx.global_step == warmup:
                marks["start"] = backend.timer.snapshot()

    result = fit_loop(cfg, backend, data, tracker=Tracker(), callbacks=[Late()])
    after = dict(zip(PHASES, (b - a for a, b in zip(marks["start"], backend.timer.snapshot()))))
    return {"steps": result.optimizer_steps - warmup, "phases": after, "traces": backend.traces()}


def check_unused_variable(n: int = 64, batch_size: int = 8) -> dict:
    """``fit`` with the user's model whose second head the loss never touches: its gradients are None, and the
    one-graph step must still run (the head takes part in the all-reduce as zeros and stays where it started).
    Returns how far each variable moved during ``fit`` (largest absolute change), the unused head's and the others'."""
    import keras

    from hvdsync.tensorflow import fit

    class TwoHeads(keras.Model):
        def __init__(self):
            super().__init__()
            self.body, self.head, self.unused = (keras.layers.Dense(HIDDEN, activation="relu"),
                                                 keras.layers.Dense(CLASSES), keras.layers.Dense(CLASSES))

        def call(self, x):
            return self.head(self.body(x))

    model = TwoHeads()
    model(np.zeros((1, FEATURES), np.float32))
    model.unused.build((None, HIDDEN))
    # The same values on every rank (fit's broadcast then leaves them), so "unchanged" means "not trained".
    model.unused.kernel.assign(np.ones((HIDDEN, CLASSES), np.float32))
    start = _weights(model)
    cfg = _config(batch_size=batch_size).replace(train={"epochs": 1})
    r = fit(cfg, data=_dataset(n), model=model,
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    end = _weights(model)
    unused = {id(v) for v in model.unused.trainable_variables}
    change = [(id(v) in unused, _mismatch(b, a)) for v, a, b in zip(model.trainable_variables, start, end)]
    return {"steps": r.optimizer_steps, "spread": r.param_spread,
            "unused_change": [c for is_unused, c in change if is_unused],
            "used_change": [c for is_unused, c in change if not is_unused]}


def check_apply_gradients(n: int = 64, batch_size: int = 8, accumulate: int = 4) -> dict:
    """The user-level API: a hand-written ``tf.function`` step calling ``apply_gradients`` once per micro-batch."""
    import horovod.tensorflow as hvd
    import keras
    import tensorflow as tf

    from hvdsync.core.train._scaling import loss_scale
    from hvdsync.core.train._plan import ShardPlan
    from hvdsync.tensorflow import broadcast_state, distributed_optimizer, init, mlp

    cfg = _config(batch_size=batch_size, accumulate=accumulate)
    init(cfg)
    data = _dataset(n)
    model = mlp(FEATURES, HIDDEN, CLASSES)
    # The loss below is each micro-batch's sum times its share of the global step: the optimizer sums the passes.
    opt = distributed_optimizer(keras.optimizers.SGD(LR), model, cfg.sync)
    broadcast_state(model, opt)
    start = _weights(model)

    @tf.function
    def step(x, y, scale):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(keras.losses.sparse_categorical_crossentropy(y, model(x, training=True),
                                                                                from_logits=True)) * scale
        return opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

    plan = ShardPlan(n, hvd.size(), batch_size, accumulate, SEED, True)
    updates = [0]  # the wrapped optimizer's iterations after each call: it counts updates, not passes
    for s in plan.epoch(0, hvd.rank()):
        scale = tf.constant(loss_scale(s.global_count, hvd.size(), "average"), tf.float32)
        updates += [int(step(data.x_train[m], data.y_train[m], scale)) for m in s.micro]
    out = {"updates": updates, "wire": opt.counter.snapshot(), "grad_tensors": len(model.trainable_variables),
           "traces": step.experimental_get_tracing_count()}
    if hvd.rank() == 0:
        out["max_diff"] = _max_diff(_weights(model), reference(start, data, plan, 1))
        out["moved"] = _max_diff(_weights(model), start)
    return out


def check_broadcast() -> dict:
    """Ranks with different weights and different optimizer state (Adam moments) end with rank 0's: the spread of
    the ranks' state fingerprints before and after, this rank's fingerprint after and rank 0's before."""
    import horovod.tensorflow as hvd
    import keras
    import tensorflow as tf

    from hvdsync.core.telemetry.monitor import fingerprint, spread
    from hvdsync.tensorflow import broadcast_state, mlp

    hvd.init()  # idempotent: each check also runs on its own
    rank = hvd.rank()
    model = mlp(FEATURES, HIDDEN, CLASSES)
    for v in model.trainable_variables:  # a different model on each rank
        v.assign(tf.random.stateless_normal(v.shape, seed=[rank, 7]))
    adam = keras.optimizers.Adam(0.01)
    adam.build(model.trainable_variables)
    adam.apply_gradients([(tf.fill(v.shape, float(rank + 1)), v) for v in model.trainable_variables])  # local step
    lazy = keras.optimizers.Adam(0.01)  # not built: broadcast_state must build it (its slots are created lazily)

    def state(opt):
        return [v.numpy() for v in model.variables] + [v.numpy() for v in opt.variables]

    def gathered(opt):
        return hvd.allgather(tf.constant(fingerprint(state(opt))[None]), name="tensorflow_workers.fingerprint").numpy()

    before = spread(gathered(adam))
    root = hvd.broadcast(tf.constant(fingerprint(state(adam))), root_rank=0, name="tensorflow_workers.root").numpy()
    broadcast_state(model, adam)
    after = spread(gathered(adam))
    broadcast_state(model, lazy)
    return {"before": before, "after": after, "fingerprint": fingerprint(state(adam)).tolist(), "root": root.tolist(),
            "lazy_built": bool(lazy.built), "lazy_slots": len(lazy.variables), "lazy_after": spread(gathered(lazy))}


def check_sync_batch_norm() -> dict:
    """Each rank holds a different, uneven part (5 and 3 rows) of one batch; statistics, outputs and input
    gradients must equal plain batch normalisation of the whole batch in one process."""
    import horovod.tensorflow as hvd
    import keras
    import tensorflow as tf

    from hvdsync.tensorflow.layers import SyncBatchNormalization

    rng = np.random.default_rng(11)
    x = (rng.normal(size=(8, 4)) * [1.0, 2.0, 0.5, 3.0] + [0.0, 5.0, -1.0, 2.0]).astype(np.float32)
    w = rng.normal(size=(8, 4)).astype(np.float32)  # weights of a loss that makes the gradient non-trivial
    hvd.init()
    rows = [slice(0, 5), slice(5, 8)][hvd.rank()]

    def run(layer, xs, ws):
        xs = tf.constant(xs)
        with tf.GradientTape() as tape:
            tape.watch(xs)
            out = layer(xs, training=True)
            loss = tf.reduce_sum(out * ws)
        return out.numpy(), tape.gradient(loss, xs).numpy(), layer.moving_mean.numpy(), layer.moving_variance.numpy()

    sync = SyncBatchNormalization(momentum=0.0)  # momentum 0: the moving statistics become the batch statistics
    eager = run(sync, x[rows], w[rows])
    traced = tf.function(lambda xs: sync(xs, training=True))(tf.constant(x[rows])).numpy()
    full = run(keras.layers.BatchNormalization(momentum=0.0), x, w)
    local = run(keras.layers.BatchNormalization(momentum=0.0), x[rows], w[rows])
    return {"out": _max_diff([eager[0]], [full[0][rows]]), "grad": _max_diff([eager[1]], [full[1][rows]]),
            "mean": _max_diff([eager[2]], [full[2]]), "var": _max_diff([eager[3]], [full[3]]),
            "mean_vs_numpy": float(np.max(np.abs(eager[2] - x.mean(0)))),
            "var_vs_numpy": float(np.max(np.abs(eager[3] - x.var(0)))),
            "traced": _max_diff([traced], [full[0][rows]]), "local_mean_off": _max_diff([local[2]], [full[2]])}


def check_loader(n: int = 101, batch_size: int = 8, accumulate: int = 3) -> dict:
    """The tf.data pipeline yields exactly the plan's micro-batches (uneven, even empty, on the last step): the
    largest difference from the plan's samples and labels over every micro-batch, and the micro-batch sizes."""
    import horovod.tensorflow as hvd

    from hvdsync.core.train._plan import ShardPlan
    from hvdsync.tensorflow import ShardedLoader

    hvd.init()
    data = _dataset(n)
    plan = ShardPlan(n, hvd.size(), batch_size, accumulate, SEED, True)
    loader = ShardedLoader(data.x_train, data.y_train, plan, hvd.rank())
    loader.set_epoch(1)
    x_diffs, y_diffs, sizes = [], [], []
    for micro, step in loader:
        for (x, y), idx in zip(micro, step.micro):
            x_diffs.append(_mismatch(x.numpy(), data.x_train[idx]))
            y_diffs.append(_mismatch(y.numpy(), data.y_train[idx]))
            sizes.append(int(x.shape[0]))
    counts = [int(c) for _, c in loader.dataset(1)]
    return {"x_diff": float(np.max(x_diffs)), "y_diff": float(np.max(y_diffs)), "sizes": sizes, "steps": len(loader),
            "global_counts": counts}


def check_digits_fp16(epochs: int) -> dict:
    """``fit`` on digits with fp16 on the wire."""
    from hvdsync.config import Config
    from hvdsync.tensorflow import fit

    cfg = Config.from_dict({"sync": {"compression": "fp16"}, "train": {"framework": "tensorflow", "epochs": epochs},
                            "tracking": {"enabled": False}})
    r = fit(cfg)
    return {"accuracy": r.test_accuracy, "wire": r.wire, "steps": r.optimizer_steps, "rounds": r.allreduce_rounds,
            "spread": r.param_spread, "elements": 64 * cfg.train.hidden + cfg.train.hidden + cfg.train.hidden * 10 + 10,
            "phases": r.phase_seconds, "seconds": r.total_seconds}


class _Recorder:
    """A Keras callback (made inside the worker) that keeps each epoch's logs as it sees them and the learning rate
    at each batch."""

    @staticmethod
    def make():
        import keras

        class Recorder(keras.callbacks.Callback):
            def __init__(self):
                super().__init__()
                self.epochs, self.lrs = [], []

            def on_train_batch_begin(self, batch, logs=None):
                self.lrs.append(float(np.asarray(self.model.optimizer.learning_rate)))

            def on_epoch_end(self, epoch, logs=None):
                self.epochs.append(dict(logs or {}))

        return Recorder()


def check_keras_fit(n: int, accumulate: int = 1, epochs: int = 2, steps_per_execution: int = 1,
                    compression: str = "none", validation: bool = False, tracking_uri: str | None = None,
                    warmup_epochs: float = 0) -> dict:
    """``model.compile(optimizer=distributed_optimizer(...))`` + ``model.fit`` on the plan's ``tf.data`` stream vs plain
    Keras in one process on the global batches (batch 8 per rank, so 16 per step on 2 ranks)."""
    import horovod.tensorflow as hvd
    import keras
    import tensorflow as tf

    from hvdsync.config import Config
    from hvdsync.core.telemetry.monitor import fingerprint, spread
    from hvdsync.tensorflow import PlanSampler, distributed_optimizer, init, mlp
    from hvdsync.tensorflow.callbacks import (BroadcastGlobalVariablesCallback, LearningRateWarmupCallback,
                                              MetricAverageCallback, MLflowCallback)

    init(_config(8))
    data = _dataset(n)
    model = mlp(FEATURES, HIDDEN, CLASSES)
    start = _weights(model)  # rank 0's are broadcast at the start of fit
    opt = distributed_optimizer(keras.optimizers.SGD(LR), compression=compression, accumulate=accumulate)
    model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], jit_compile=False, steps_per_execution=steps_per_execution)
    sampler = PlanSampler(n, 8, accumulate, SEED, rank=hvd.rank())
    x, y = tf.constant(data.x_train), tf.constant(data.y_train)
    stream = sampler.dataset(lambda i: (tf.gather(x, i), tf.gather(y, i)))
    local, seen = _Recorder.make(), _Recorder.make()  # before / after the metric average
    callbacks = [sampler, local, BroadcastGlobalVariablesCallback(0), MetricAverageCallback()]
    if warmup_epochs:
        callbacks.append(LearningRateWarmupCallback(LR, warmup_epochs))
    tracker = None
    if tracking_uri:
        cfg = Config.from_dict({"tracking": {"tracking_uri": tracking_uri, "experiment": "keras"}})
        tracker = MLflowCallback(cfg, params={"model": "mlp"})
        callbacks.append(tracker)
    callbacks.append(seen)
    # Validation: uneven shares of 30 held-out samples (11 on rank 0, 19 on rank 1).
    xv, yv = _dataset(200).x_train[100:130], _dataset(200).y_train[100:130]
    mine = slice(0, 11) if hvd.rank() == 0 else slice(11, 30)
    history = model.fit(stream, epochs=epochs, verbose=0, callbacks=callbacks,
                        validation_data=(xv[mine], yv[mine]) if validation else None)
    params = _weights(model)
    g = hvd.allgather(tf.constant([fingerprint(params)]), name=f"keras.fp.{n}.{accumulate}.{compression}")
    out = {"history": history.history, "local": local.epochs, "lrs": seen.lrs, "params": params,
           "wire": opt.counter.snapshot(), "iterations": int(opt.iterations.numpy()), "spread": spread(g.numpy()),
           "batches": sum(len(s.micro) for s in sampler.plan.epoch(0, hvd.rank())) * epochs,
           "steps": sampler.plan.steps_per_epoch() * epochs, "grad_tensors": len(model.trainable_variables),
           "elements": sum(int(v.numpy().size) for v in model.trainable_variables),
           "state": sampler.state_dict(), "run_id": tracker.run_id if tracker else None,
           # The fast path (accumulate 1) leaves the sum variables and the pass counter untouched.
           "direct": opt.direct, "passes": int(opt._passes.numpy()),
           "sums_abs_max": float(np.max([np.max(np.abs(s.numpy()), initial=0.0) for s in opt.gradient_sums],
                                        initial=0.0))}
    if hvd.rank() == 0:
        from hvdsync.core.train._plan import ShardPlan

        plan = ShardPlan(n, hvd.size(), 8, 1, SEED, True)
        out.update(max_diff=_max_diff(params, reference(start, data, plan, epochs)), moved=_max_diff(params, start))
        if validation:  # the final model on all 30 validation samples, and each rank's share on its own
            hits = np.argmax(model.predict(xv, verbose=0), axis=1) == yv
            out.update(val_all=float(hits.mean()), val_ranks=[float(hits[:11].mean()), float(hits[11:].mean())])
    return out


def check_plan_stream(n: int = 101, batch_size: int = 8, accumulate: int = 3) -> dict:
    """The plan's tf.data stream mapped onto a user lookup: which samples each rank reads, with what weights."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    from hvdsync.tensorflow import PlanSampler

    hvd.init()
    ids = tf.range(n, dtype=tf.int64)
    sampler = PlanSampler(n, batch_size, accumulate, SEED)
    sampler.set_epoch(1)
    read, weights, batches = [], [], 0
    for x, _, w in sampler.dataset(lambda i: (tf.gather(ids, i), tf.gather(ids, i))):
        read += x.numpy().tolist()
        weights.append(w.numpy().tolist())
        batches += 1
    # Half-way resume: a fresh sampler in a world of 1 continues with exactly what was not consumed yet.
    half = PlanSampler(n, batch_size, accumulate, SEED, rank=0, world_size=hvd.size())
    half.load_state_dict({"epoch": 1, "consumed": 48})
    rest = PlanSampler(n, batch_size, accumulate, SEED, rank=0, world_size=1)
    rest.load_state_dict(half.state_dict())
    rest_read = [i for x, _ in rest.dataset() for i in x.numpy().tolist()]
    first = sampler.plan.order(1)[:48].tolist()
    return {"read": read, "weights": weights, "batches": batches, "rest": rest_read, "first": first}


def check_user_cnn_fit(epochs: int = 8) -> dict:
    """``hvdsync.tensorflow.fit`` with the user's model (the CNN) and loss (label-smoothed cross-entropy, a mean)
    on digits as 8x8 images, through the shared loop."""
    import keras
    import tensorflow as tf

    from hvdsync.config import Config
    from hvdsync.tensorflow import CNN, fit

    cfg = Config.from_dict({"data": {"dataset": "digits_images", "batch_size": 32},
                            "train": {"framework": "tensorflow", "epochs": epochs, "optimizer": "adam", "lr": 0.01},
                            "tracking": {"enabled": False}})
    model = CNN(10, width=16)
    model(np.zeros((1, 8, 8, 1), np.float32))  # its variables exist from its first call

    def smoothed(y, logits):
        return tf.reduce_mean(keras.losses.categorical_crossentropy(tf.one_hot(y, 10), logits, from_logits=True,
                                                                     label_smoothing=0.1))

    r = fit(cfg, model=model, loss=smoothed, optimizer=keras.optimizers.Adam(0.01))
    return {"accuracy": r.test_accuracy, "spread": r.param_spread, "params": int(model.count_params())}


def run_all(digits_epochs: int = 5, tracking_uri: str | None = None) -> dict:
    """Every check, in one worker process per rank (TensorFlow's import is the slow part)."""
    import time

    timings, out = {}, {}
    checks = {
        "even": lambda: check_fit(96, 8, 1, 2),
        "accumulate": lambda: check_fit(96, 8, 4, 2),
        "uneven": lambda: check_fit(101, 8, 3, 2),
        "even_fp16": lambda: check_fit(96, 8, 1, 2, compression="fp16"),
        "phases": check_phases,
        "unused_variable": check_unused_variable,
        "apply_gradients": check_apply_gradients,
        "broadcast": check_broadcast,
        "sync_bn": check_sync_batch_norm,
        "loader": check_loader,
        "fp16": lambda: check_digits_fp16(digits_epochs),
        "plan_stream": check_plan_stream,
        # Keras compile + fit. 96 samples: 6 full steps of 16 per epoch; 101: the last step holds 5 (3 + 2).
        "keras_even": lambda: check_keras_fit(96, validation=True, tracking_uri=tracking_uri),
        "keras_uneven_spe3": lambda: check_keras_fit(101, steps_per_execution=3),
        "keras_accumulate": lambda: check_keras_fit(96, accumulate=4),
        "keras_fp16": lambda: check_keras_fit(96, accumulate=4, compression="fp16"),
        "keras_warmup": lambda: check_keras_fit(96, epochs=3, warmup_epochs=2),
        "user_cnn": check_user_cnn_fit,
    }
    for name, check in checks.items():
        t = time.perf_counter()
        out[name] = check()
        timings[name] = time.perf_counter() - t
    out["timings"] = timings
    return out
