"""Jobs the Ray tests run, and the driver that launches them on the Ray head's test host.

The driver runs *on* node1 (the head's network namespace), as a user's script runs on a node of a Ray cluster: the
workers must reach its Horovod rendezvous. ``python -m tests.ray.ray_jobs '<spec JSON>'`` launches with
:mod:`hvdsync.launch.ray` and prints one line ``RESULT <JSON>``.
"""
import json
import os
import sys


def user_torch_fit(n=301, batch=16, epochs=2, seed=5):
    """The user's own MLP and Dataset through hvdsync.torch (PlanSampler + DataLoader, fit): the job of the
    multi-host tests (:func:`tests.hosts.jobs_workers.user_fit`), here on Ray's workers."""
    from tests.hosts.jobs_workers import user_fit

    return user_fit(n=n, batch=batch, epochs=epochs, seed=seed)


def user_keras_fit(tracking_uri, n=600, epochs=3, seed=3):
    """The user's own Keras model: ``compile`` with hvdsync's distributed optimizer, ``fit`` on the plan's stream
    with the standard callbacks (broadcast, metric average, MLflow on rank 0); every read counted."""
    import hvdsync.tensorflow as hs  # first: it quiets TensorFlow's start-up

    import horovod.tensorflow as hvd
    import keras
    import numpy as np
    import tensorflow as tf

    from hvdsync.config import Config
    from hvdsync.core.train.data import digits

    cfg = Config.from_dict({"data": {"batch_size": 16}, "train": {"seed": seed, "epochs": epochs, "lr": 0.05},
                            "tracking": {"tracking_uri": tracking_uri, "experiment": "ray-keras"}})
    info = hs.init(cfg)
    split = digits(seed=seed)
    x, y = tf.constant(split.x_train[:n]), tf.constant(split.y_train[:n])
    reads = np.zeros(n, np.int64)

    def note(i):
        np.add.at(reads, i.numpy(), 1)
        return i

    def lookup(i):
        i = tf.py_function(note, [i], tf.int64)  # the indices this rank really fetched
        i.set_shape([None])  # py_function forgets it
        return tf.gather(x, i), tf.gather(y, i)

    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10)])
    model.compile(optimizer=hs.distributed_optimizer(keras.optimizers.SGD(cfg.train.lr), sync=cfg.sync),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"],
                  jit_compile=False)
    sampler = hs.PlanSampler.from_config(cfg, n)
    callbacks = hs.callbacks.standard_callbacks(cfg)
    history = model.fit(sampler.dataset(lookup), epochs=epochs, shuffle=False, verbose=0,
                        callbacks=[sampler, *callbacks])
    run_id = next((c.run_id for c in callbacks if hasattr(c, "run_id")), None)
    params = np.concatenate([np.ravel(v.numpy()) for v in model.trainable_variables]).astype(np.float64)
    return {"host": os.environ.get("HOROVOD_HOSTNAME"), "rank": info.rank, "size": hvd.size(),
            "reads": reads.tolist(), "params": params.tolist(), "loss": history.history["loss"], "run_id": run_id}


def main(spec: dict) -> dict:
    import time

    from hvdsync.config import Config
    from hvdsync.launch import ray as ray_launch

    start = time.monotonic()
    options = {k: spec[k] for k in ("address", "cpus_per_worker", "network_interfaces") if k in spec}
    if spec["job"] == "train":
        extra = {k: spec[k] for k in ("log_dir",) if k in spec}
        if spec.get("ledger"):
            # Each worker counts the samples it trained on (its own copy of the ledger, shipped with the job).
            from hvdsync.core.elastic._ledger import SampleLedger

            extra["callbacks"] = [SampleLedger()]
        cfg = Config.from_dict(spec["config"])
        if "faults" in spec:
            # The lab's fault callback (hvdlab.faults), armed in the workers: Ray's actors do not inherit this
            # process's environment, so its variable goes with the job's own.
            from hvdlab import faults

            cfg, extra["env"] = faults.enable(cfg), {faults.ENV: spec["faults"]}
        result = ray_launch.train(cfg, progress=False, **options, **extra).to_dict()
    else:
        fn = {"user_torch_fit": user_torch_fit, "user_keras_fit": user_keras_fit}[spec["job"]]
        result = ray_launch.run(fn, kwargs=spec.get("kwargs", {}), np=spec["np"], progress=False, **options)
    return {"result": result, "seconds": time.monotonic() - start}


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(json.loads(sys.argv[1]))), flush=True)
