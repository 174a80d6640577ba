"""Plain elastic Horovod with Keras 3, no hvdsync in the training: ``model.fit`` inside ``hvd.elastic.run``, with
``hvd.elastic.KerasState`` and Horovod's commit and update callbacks, so that workers can come and go. Launch it
with a host discovery script, a program that prints the hosts available now, one ``host:slots`` a line:

    printf '#!/bin/sh\\ncat hosts.txt\\n' > discover.sh && chmod +x discover.sh && echo localhost:1 > hosts.txt
    horovodrun -np 1 --min-np 1 --max-np 2 --host-discovery-script ./discover.sh --gloo \\
        python examples/plain/horovod_elastic_keras.py --epochs 6
    echo localhost:2 > hosts.txt     # meanwhile, from another shell: a second worker joins at the next commit

One machine with several slots is ``localhost:N`` (it needs Horovod patch 0010; before it, an elastic job waited for
a second host). Losing a worker works the same way: the survivors roll back to the last commit and go on.
Needs Horovod patch 0009 (Keras 3 model and optimizer variables in the elastic state).

The gradients are averaged by ``hvd.DistributedOptimizer`` (under Keras 3 with Horovod patch 0008); the arrays
come from hvdsync's copy of scikit-learn's digits, as in ``horovod_torch.py``.
"""
import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import horovod.tensorflow.keras as hvd  # noqa: E402
import keras  # noqa: E402

from hvdsync.datasets import digits  # noqa: E402


class History(keras.callbacks.Callback):
    """Rank 0 appends one JSON line per epoch: the global epoch, the workers and the loss."""

    def __init__(self, state, path):
        super().__init__()
        self.state, self.path = state, path

    def on_epoch_end(self, epoch, logs=None):
        if self.path and hvd.rank() == 0:
            with open(self.path, "a") as f:
                f.write(json.dumps({"epoch": self.state.epoch, "size": hvd.size(), "loss": logs["loss"]}) + "\n")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=32, help="samples per worker per step")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--history", help="rank 0 appends one JSON line per epoch here")
    p.add_argument("--results", help="every rank writes RESULTS.rank<r>.json at the end")
    args = p.parse_args(argv)

    hvd.init()
    data = digits(seed=0)
    keras.utils.set_random_seed(0)      # the same initial model everywhere; a joining worker gets rank 0's anyway
    model = keras.Sequential([keras.Input((data.n_features,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(data.n_classes)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(learning_rate=args.lr, momentum=0.9)),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    # What survives a reset: the model, the optimizer's variables, the epoch and batch reached.
    state = hvd.elastic.KerasState(model, batch=0, epoch=0)
    first = {}

    @hvd.elastic.run
    def train(state):
        first.setdefault("epoch", state.epoch)
        # Each worker its own share, of one length, so every worker takes the same number of steps.
        n = len(data.x_train) // hvd.size()
        x, y = data.x_train[hvd.rank()::hvd.size()][:n], data.y_train[hvd.rank()::hvd.size()][:n]
        callbacks = [hvd.elastic.UpdateEpochStateCallback(state), hvd.elastic.UpdateBatchStateCallback(state),
                     hvd.elastic.CommitStateCallback(state, batches_per_commit=1), History(state, args.history)]
        model.fit(x, y, batch_size=args.batch_size, epochs=args.epochs - state.epoch, shuffle=False,
                         callbacks=callbacks, verbose=0)

    train(state)
    loss = float(model.evaluate(data.x_train, data.y_train, verbose=0))
    if args.results:
        with open(f"{args.results}.rank{hvd.rank()}.json", "w") as f:
            json.dump({"rank": hvd.rank(), "size": hvd.size(), "epoch": state.epoch, "first_epoch": first["epoch"],
                       "iterations": int(model.optimizer.iterations.numpy()), "loss": loss,
                       "params": [w.tolist() for w in model.get_weights()]}, f)
    if hvd.rank() == 0:
        print(f"epochs {state.epoch}, workers {hvd.size()}, training loss {loss:.4f}")


if __name__ == "__main__":
    main()
