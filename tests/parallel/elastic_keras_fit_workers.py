"""Runs in each worker of an elastic job (sent by value): your own Keras model trained with ``model.fit`` under
hvdsync's elastic state and :class:`hvdsync.tensorflow.callbacks.ElasticStateCallback`; the faults of
``HVDLAB_FAULTS`` (:mod:`hvdlab.faults`) fire before the steps they name, from a Keras callback of this test."""


def keras_fit(cfg_dict: dict) -> dict:
    import os
    from pathlib import Path

    import hvdsync.tensorflow as hs  # noqa: I001 - first: it quiets TensorFlow's start-up
    import horovod.tensorflow as hvd
    import keras
    import numpy as np
    import tensorflow as tf

    from hvdsync.config import Config
    from hvdsync.core.telemetry import monitor
    from hvdsync.datasets import load
    from hvdlab.faults import fire
    from hvdsync.core.elastic.loop import RUN_DIR_ENV

    run_dir, host = Path(os.environ[RUN_DIR_ENV]), os.environ.get("HOROVOD_HOSTNAME", "localhost")
    (run_dir / "pids").mkdir(exist_ok=True)
    (run_dir / "pids" / f"{host}.pid").write_text(str(os.getpid()))
    cfg = Config.from_dict(cfg_dict)
    hs.init(cfg)
    data = load(cfg.data, cfg.train.seed)
    x, y = tf.constant(data.x_train), tf.constant(data.y_train.astype(np.int64))
    keras.utils.set_random_seed(cfg.train.seed)
    model = keras.Sequential([keras.Input((data.n_features,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(data.n_classes)])
    model.compile(optimizer=hs.distributed_optimizer(keras.optimizers.SGD(cfg.train.lr, momentum=0.9),
                                                     sync=cfg.sync),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False)
    state = hs.elastic_state(model, model.optimizer, cfg, entries=[])
    # What a commit saves and a joining worker is sent: every accumulation sum and the pass counter, once each.
    listed = [id(v) for v in state.tensors.variables]
    own = [*model.optimizer.gradient_sums, model.optimizer._passes, *model.optimizer.inner_optimizer.variables]
    state_lists = {"times_listed": [listed.count(id(v)) for v in own],   # per optimizer variable
                   "listed": len(listed), "distinct_listed": len(set(listed))}

    class Faults(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            fire(state.position.step)

    def train(state):
        # Where each (re-)entry starts: (epoch, sample, world size); a user object, so rolled back with a restore.
        state.user["entries"] = [*state.user["entries"], [state.position.epoch, state.position.consumed, hvd.size()]]
        hs.keras_fit(state, model, lambda: hs.PlanSampler.from_config(cfg, len(data.x_train)),
                     lambda i: (tf.gather(x, i), tf.gather(y, i)), cfg.train.epochs, callbacks=[Faults()], verbose=0)

    hs.run_elastic(train, state)
    fingerprints = hvd.allgather(tf.constant(monitor.fingerprint([v.numpy() for v in model.trainable_variables])[None]))
    correct = int((np.argmax(model.predict(data.x_test, verbose=0), 1) == data.y_test).sum())
    os.environ["HOROVOD_RANK"] = str(hvd.rank())  # the launcher reads rank 0's result by the rank of now
    return {"rank": hvd.rank(), "size": hvd.size(), "steps": state.position.step, "epoch": state.position.epoch,
            "resets": state.events, "entries": state.user["entries"], "accuracy": correct / len(data.y_test),
            "spread": monitor.spread(fingerprints.numpy()), **state_lists}
