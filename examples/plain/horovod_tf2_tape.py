"""Plain Horovod with a TensorFlow 2 training loop, no hvdsync: ``hvd.DistributedGradientTape`` averages the
gradients of a Keras 3 model over the ranks. Launch it as any Horovod script:

    horovodrun -np 2 -H localhost:2 --gloo python examples/plain/horovod_tf2_tape.py --steps 30 --out w

Each rank starts from different random weights (seeded by its rank), takes rank 0's with
``hvd.broadcast_variables``, and trains on its own half of a small synthetic regression set. With ``--out w`` every
rank writes its final weights to ``w.rank<r>.npz`` and rank 0 its initial ones to ``w.start.npz``
(``tests/parallel/test_horovod_keras3.py`` checks that the ranks end equal and moved). Needs hvdsync's Horovod
build (its patch 0008 makes the tape work with Keras 3 variables).
"""
import argparse

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf


def main(argv=None) -> list[np.ndarray]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=16, help="samples per rank per step")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--out", help="prefix of the .npz files: <out>.rank<r>.npz, and <out>.start.npz from rank 0")
    args = p.parse_args(argv)

    hvd.init()                                    # 1. one process per worker; rank and size from the launcher
    rng = np.random.default_rng(0)                # the same data set on every rank ...
    x = rng.normal(size=(args.steps * args.batch_size * hvd.size(), 8)).astype(np.float32)
    y = (np.tanh(x @ rng.normal(size=(8, 1))) + 0.1 * rng.normal(size=(len(x), 1))).astype(np.float32)
    x, y = x[hvd.rank()::hvd.size()], y[hvd.rank()::hvd.size()]   # 2. ... and each rank its own share of it

    keras.utils.set_random_seed(hvd.rank())       # different initial weights on each rank: the broadcast matters
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(1)])
    opt = keras.optimizers.Adam(args.lr)
    start = [w.copy() for w in model.get_weights()]
    opt.build(model.trainable_variables)          # (Keras 3 makes the optimizer's state here, not in its first step)
    # 3. every rank starts from rank 0's weights and optimizer state
    hvd.broadcast_variables(model.variables + opt.variables, root_rank=0)

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(xb, training=True) - yb))
        tape = hvd.DistributedGradientTape(tape)                  # 4. gradients averaged over the ranks
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    for i in range(args.steps):
        lo = i * args.batch_size
        loss = step(x[lo:lo + args.batch_size], y[lo:lo + args.batch_size])
    weights = model.get_weights()
    if args.out:
        np.savez(f"{args.out}.rank{hvd.rank()}.npz", *weights)
        if hvd.rank() == 0:
            np.savez(f"{args.out}.start.npz", *start)
            print(f"last step's loss on rank 0's share: {float(loss):.4f}")
    return weights


if __name__ == "__main__":
    main()
