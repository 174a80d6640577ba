"""Runs inside each of 2 Horovod workers (sent by value): straggler-aware shares and a growing batch, for PyTorch
(your Dataset through a DataLoader with PlanSampler, your model through ``fit``) and TensorFlow (your Keras model
through ``fit``, the ``tf.data`` PlanSampler). One job per framework; tests/parallel/test_shares.py asserts.

Rank 1 is made 4x slower by the lab's straggler (:class:`hvdlab.straggler.SlowRank`), passed to ``fit`` as its phase
timer and a callback.
"""
import numpy as np

EPOCHS, BATCH = 3, 32
# Rank 1 computes this many times slower: far enough from 1 that a busy machine cannot make it look fast.
SLOWDOWN = 4.0


def _config(**data):
    from hvdsync.config import Config

    return Config.from_dict({"data": {"batch_size": BATCH, **data},
                             "train": {"epochs": EPOCHS, "lr": 0.05, "hidden": 128},
                             "tracking": {"enabled": False}, "monitor": {"every": 0}})


def _summary(result, counter, allgather, lrs):
    """What both frameworks return: reads per epoch summed over ranks (counted), the shares, the growth run, and
    the test samples each rank scored per epoch (counted where they are read)."""
    reads = allgather(np.asarray(counter.epochs, dtype=np.float64).reshape(1, -1)).reshape(2, EPOCHS, -1)
    scored = allgather(np.asarray(counter.test_epochs, dtype=np.float64).reshape(1, -1)).reshape(2, EPOCHS, -1)
    return {"reads_per_epoch": reads.sum(0).astype(int).tolist(), "param_spread": result.param_spread,
            "test_reads_per_epoch": scored.sum(0).astype(int).tolist(),
            "test_rank_samples": scored.sum(2).T.astype(int).tolist(),
            "rank_samples": [h["rank_samples"] for h in result.history],
            "shares": [h["shares"] for h in result.history], "steps": result.optimizer_steps,
            "plan_steps": result.history and None, "lrs": lrs}


def _read_counter(reads, test_reads):
    from hvdsync.core.train.callbacks import Callback

    class PerEpoch(Callback):
        """Keeps each epoch's read counts (training samples; test samples scored, after the epoch's evaluation)
        and starts the next epoch from zero."""

        def __init__(self):
            self.epochs, self.test_epochs = [], []

        def on_epoch_end(self, ctx):
            self.epochs.append(reads.copy())
            self.test_epochs.append(test_reads.copy())
            reads[:] = 0
            test_reads[:] = 0

    return PerEpoch()


def _growth_run(fit, lr_of):
    """The built-in MLP on digits with the batch doubling at epoch 1 and again at 2: rounds, accuracy, lr."""
    from hvdsync.core.train.callbacks import Callback

    class LearningRates(Callback):
        def __init__(self):
            self.lrs = []

        def on_epoch_begin(self, ctx):  # after the loop's own growth callback has set the epoch's rate
            self.lrs.append(lr_of(ctx.backend))

    lrs = LearningRates()
    result = fit(_config(batch_growth={1: 2, 2: 4}), callbacks=[lrs])
    return {"sync_rounds": [h["sync_rounds"] for h in result.history],
            "global_batch": [h["global_batch"] for h in result.history],
            "accuracy": result.test_accuracy, "param_spread": result.param_spread, "lrs": lrs.lrs}


def torch_workers():
    import horovod.torch as hvd
    import torch
    from torch.utils.data import DataLoader

    import hvdsync.torch as ht
    from hvdsync.core.train.data import digits

    data = digits(seed=0)
    n = len(data.x_train)
    reads = np.zeros(n, dtype=np.int64)

    class Counted(torch.utils.data.Dataset):
        """The user's Dataset; counts every sample it hands out."""

        def __len__(self):
            return n

        def __getitem__(self, i):
            reads[i] += 1
            return torch.from_numpy(data.x_train[i]), int(data.y_train[i])

    test_reads = np.zeros(len(data.x_test), dtype=np.int64)

    class CountedTest(torch.utils.data.Dataset):
        """The user's test set; counts every sample the evaluation scores."""

        def __len__(self):
            return len(data.x_test)

        def __getitem__(self, i):
            test_reads[i] += 1
            return torch.from_numpy(data.x_test[i]), int(data.y_test[i])

    from hvdlab.straggler import SlowRank

    cfg = _config(shares="adaptive")
    ht.init(cfg)
    loader = DataLoader(Counted(), batch_sampler=ht.PlanSampler.from_config(cfg, n))
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    counter = _read_counter(reads, test_reads)
    slow = SlowRank(rank=1, factor=SLOWDOWN)
    result = ht.fit(cfg, model=model, loss=torch.nn.CrossEntropyLoss(), train=loader, test=CountedTest(),
                    callbacks=[slow, counter], timer=slow)
    gather = lambda a: hvd.allgather(torch.as_tensor(a)).numpy()  # noqa: E731
    out = _summary(result, counter, gather, [])
    out["test_size"] = len(data.x_test)

    # Your own loop: rebalance() from your measured work seconds (here rank 1 says it worked twice as long).
    sampler = ht.PlanSampler(n, batch_size=BATCH, accumulate=2)
    out["rebalanced"] = sampler.rebalance(work_seconds=2.0 if hvd.rank() == 1 else 1.0)
    sampler.set_epoch(1)
    mine = [i for micro, _ in sampler.steps(DataLoader(range(n), batch_sampler=sampler)) for m in micro
            for i in m.tolist()]
    out["own_loop_reads"] = np.bincount(gather(np.asarray(mine)).ravel(), minlength=n).tolist()
    out["own_loop_rank_samples"] = gather(np.array([len(mine)])).ravel().tolist()
    out["own_loop_steps"] = gather(np.array([len(sampler.planned_steps())])).ravel().tolist()

    out["growth"] = _growth_run(ht.fit, lambda b: b.optimizer.param_groups[0]["lr"])
    return out


def tensorflow_workers():
    import hvdsync.tensorflow as hs  # first: it keeps TensorFlow's start-up lines quiet
    import horovod.tensorflow as hvd
    import keras
    import tensorflow as tf

    from hvdsync.core.train.data import digits

    data = digits(seed=0)
    n = len(data.x_train)
    reads = np.zeros(n, dtype=np.int64)
    from hvdsync.core.train.callbacks import Callback

    test_reads = np.zeros(len(data.x_test), dtype=np.int64)
    test_rows = {row.tobytes(): i for i, row in enumerate(data.x_test)}

    class CountSteps(Callback):
        """Counts the samples of every step the loop hands to the model on this rank, and the test samples the
        built-in evaluation scores (by their rows: it hands ``count_correct`` arrays, not indices)."""

        def on_train_begin(self, ctx):
            score = ctx.backend.count_correct

            def counted(x, y):
                np.add.at(test_reads, [test_rows[row.tobytes()] for row in x], 1)
                return score(x, y)

            ctx.backend.count_correct = counted

        def on_step_end(self, ctx):
            np.add.at(reads, ctx.last_step.indices, 1)

        def on_train_end(self, ctx):
            self.traces = ctx.backend.traces()

    from hvdlab.straggler import SlowRank

    cfg = _config(shares="adaptive")
    hs.init(cfg)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(128, activation="relu"), keras.layers.Dense(10)])
    counter = _read_counter(reads, test_reads)
    steps = CountSteps()
    slow = SlowRank(rank=1, factor=SLOWDOWN)
    result = hs.fit(cfg, data, model=model, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                    optimizer=keras.optimizers.SGD(0.05), callbacks=[slow, steps, counter], timer=slow)
    gather = lambda a: hvd.allgather(tf.constant(a)).numpy()  # noqa: E731
    out = _summary(result, counter, gather, [])
    out["test_size"] = len(data.x_test)
    out["traces"] = steps.traces

    # The tf.data helper in your own pipeline: rebalance() from your measured work seconds.
    sampler = hs.PlanSampler(n, batch_size=BATCH, accumulate=2)
    out["rebalanced"] = sampler.rebalance(work_seconds=2.0 if hvd.rank() == 1 else 1.0)
    batches = list(sampler.dataset().as_numpy_iterator())
    mine = np.concatenate([i for i, _ in batches])
    out["own_loop_reads"] = np.bincount(gather(mine).ravel(), minlength=n).tolist()
    out["own_loop_rank_samples"] = gather(np.array([len(mine)])).ravel().tolist()
    out["own_loop_steps"] = gather(np.array([len(batches)])).ravel().tolist()

    out["growth"] = _growth_run(hs.fit, lambda b: float(np.asarray(b.optimizer.learning_rate)))
    out["keras_growth"] = _keras_growth_run(data, gather)
    return out


def _keras_growth_run(data, gather):
    """A growing batch through Keras' own ``fit`` on the plan's ``tf.data`` stream (the sampler from the config, no
    other hvdsync callback): optimizer steps, samples read (counted in the lookup), learning rate, per epoch."""
    import warnings

    import horovod.tensorflow as hvd
    import keras
    import tensorflow as tf

    import hvdsync.tensorflow as hs
    from hvdsync.core.telemetry.monitor import fingerprint, spread
    from hvdsync.tensorflow.callbacks import BroadcastGlobalVariablesCallback

    cfg = _config(batch_growth={1: 2, 2: 4})
    n = len(data.x_train)
    reads = []

    def count(i):
        reads.append(i.numpy().copy())
        return i

    def lookup(i):
        i = tf.py_function(count, [i], tf.int64)
        i.set_shape((None,))
        return tf.gather(x, i), tf.gather(y, i)

    class PerEpoch(keras.callbacks.Callback):
        def __init__(self):
            self.steps, self.reads, self.lrs = [], [], []

        def on_epoch_begin(self, epoch, logs=None):  # after the sampler's: the rate this epoch trains with
            self.lrs.append(float(np.asarray(self.model.optimizer.learning_rate)))
            self.start = len(reads)
            self.steps.append(0)

        def on_train_batch_end(self, batch, logs=None):
            # Counted here, not by optimizer.iterations: on a stream of unknown length Keras' counter also counts
            # the call that found the pass empty (plain Keras alike; no update is made in it).
            self.steps[-1] += 1

        def on_epoch_end(self, epoch, logs=None):
            mine = np.concatenate(reads[self.start:])
            self.reads.append(np.bincount(mine, minlength=n))

    x, y = tf.constant(data.x_train), tf.constant(data.y_train)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(128, activation="relu"), keras.layers.Dense(10)])
    model.compile(optimizer=hs.distributed_optimizer(keras.optimizers.SGD(cfg.train.lr)), jit_compile=False,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    sampler = hs.PlanSampler.from_config(cfg, n)
    per_epoch = PerEpoch()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(sampler.dataset(lookup), epochs=EPOCHS, verbose=0, shuffle=False,
                  callbacks=[sampler, per_epoch, BroadcastGlobalVariablesCallback(0)])
    fp = hvd.allgather(tf.constant([fingerprint([v.numpy() for v in model.trainable_variables])]), name="kgrow.fp")
    return {"steps": per_epoch.steps, "lrs": per_epoch.lrs, "param_spread": spread(fp.numpy()),
            "reads_per_epoch": gather(np.stack(per_epoch.reads)[None]).sum(0).tolist(),
            "warnings": [str(w.message) for w in caught]}
