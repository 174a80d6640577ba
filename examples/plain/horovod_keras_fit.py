"""Plain Horovod with Keras 3 ``compile``/``fit``, no hvdsync: the recipe of Horovod's Keras guide with only
``horovod.tensorflow.keras``. Launch it as any Horovod script:

    horovodrun -np 2 -H localhost:2 --gloo python examples/plain/horovod_keras_fit.py --epochs 3 --out w

Each rank starts from different random weights (seeded by its rank) and trains on its own half of a small
synthetic regression set; ``BroadcastGlobalVariablesCallback`` gives every rank rank 0's weights before the first
step, ``DistributedOptimizer`` averages the gradients, ``MetricAverageCallback`` the logged loss. With ``--out w``
every rank writes its final weights to ``w.rank<r>.npz`` and rank 0 its initial ones to ``w.start.npz``
(``tests/parallel/test_horovod_keras3.py`` checks that the ranks end equal and moved). Needs hvdsync's Horovod
build (its patch 0008 makes these Horovod helpers work under Keras 3).
"""
import argparse

import horovod.tensorflow.keras as hvd
import keras
import numpy as np


def main(argv=None) -> list[np.ndarray]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=16, help="samples per rank per step")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--samples", type=int, default=256)
    p.add_argument("--out", help="prefix of the .npz files: <out>.rank<r>.npz, and <out>.start.npz from rank 0")
    args = p.parse_args(argv)

    hvd.init()                                    # 1. one process per worker; rank and size from the launcher
    rng = np.random.default_rng(0)                # the same data set on every rank ...
    x = rng.normal(size=(args.samples, 8)).astype(np.float32)
    y = (np.tanh(x @ rng.normal(size=(8, 1))) + 0.1 * rng.normal(size=(args.samples, 1))).astype(np.float32)
    x, y = x[hvd.rank()::hvd.size()], y[hvd.rank()::hvd.size()]   # 2. ... and each rank its own share of it

    keras.utils.set_random_seed(hvd.rank())       # different initial weights on each rank: the broadcast matters
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(1)])
    start = [w.copy() for w in model.get_weights()]
    # 3. the optimizer averages the gradients over the ranks (any Keras 3 optimizer)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(args.lr, momentum=0.9))
    model.compile(optimizer=opt, loss="mse")
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),   # 4. every rank starts from rank 0's state
                 hvd.callbacks.MetricAverageCallback()]               # 5. logs show the mean over the ranks
    history = model.fit(x, y, batch_size=args.batch_size, epochs=args.epochs, callbacks=callbacks,
                        verbose=2 if hvd.rank() == 0 else 0)
    weights = model.get_weights()
    if args.out:
        np.savez(f"{args.out}.rank{hvd.rank()}.npz", *weights)
        if hvd.rank() == 0:
            np.savez(f"{args.out}.start.npz", *start)
            print(f"loss (mean over ranks) per epoch: {[round(float(v), 4) for v in history.history['loss']]}")
    return weights


if __name__ == "__main__":
    main()
