"""Runs inside each of 2 Horovod workers (sent by value): local SGD against synchronous SGD at the same samples,
in PyTorch (:func:`run_torch`) and TensorFlow/Keras (:func:`run_tensorflow`), on the shared loop and on the
user's own path (a hand-written torch loop; Keras ``compile``/``fit``).

tests/parallel/test_local_sgd.py asserts on the numbers; one job per framework keeps the suite fast.
"""
import numpy as np

# 4 epochs of digits at 2 x 32 samples per step: 22 steps per epoch, 88 in all, a multiple of 4 and 8, so the last
# step is an averaging step and the final accuracy is the averaged model's.
BASE = {"train": {"seed": 3, "epochs": 4, "hidden": 64, "lr": 0.1}, "data": {"batch_size": 32},
        "tracking": {"enabled": False}}
MODES = {"sync": {}, "h4": {"mode": "local_sgd", "period": 4}, "h8": {"mode": "local_sgd", "period": 8},
         "post": {"mode": "local_sgd", "period": 4, "warmup_steps": 8}}


def _user_loop_torch(steps=12, period=4):
    """The user's own model, optimizer (Adam) and loop through hvdsync.torch.distributed_optimizer. Returns the
    rounds, the largest difference between the ranks' parameters and Adam moments after each step, and how far a
    fresh optimizer loaded from the state dict is from the original (its step count, its moments)."""
    import horovod.torch as hvd
    import torch

    import hvdsync.torch as hs
    from hvdsync.config import SyncConfig

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    opt = hs.distributed_optimizer(torch.optim.Adam(model.parameters(), lr=0.01), model,
                                   SyncConfig(mode="local_sgd", period=period))
    hs.broadcast_state(model, opt)
    gen = torch.Generator().manual_seed(100 + hvd.rank())       # each rank its own data
    rank_diffs = []
    for _ in range(steps):
        x, y = torch.randn(16, 8, generator=gen), torch.randint(0, 3, (16,), generator=gen)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()] +
                         [opt.optimizer.state[p]["exp_avg"].reshape(-1) for p in model.parameters()])
        gathered = hvd.allgather(flat.reshape(1, -1), name="check.user")
        rank_diffs.append(float((gathered[0] - gathered[1]).abs().max()))
    # The step count travels with the optimizer's state: a fresh optimizer loaded from it continues the schedule.
    fresh = hs.distributed_optimizer(torch.optim.Adam(model.parameters(), lr=0.01), model,
                                     SyncConfig(mode="local_sgd", period=period))
    fresh.load_state_dict(opt.state_dict())
    return {"rounds": opt.rounds, "rank_diffs": rank_diffs, "resumed_steps": fresh.steps,
            "resumed_moments_diff": float(torch.stack([(fresh.optimizer.state[p]["exp_avg"] -
                                                        opt.optimizer.state[p]["exp_avg"]).abs().max()
                                                       for p in model.parameters()]).max())}   # NaN propagates


def run_torch():
    import horovod.torch as hvd

    from hvdsync.config import Config
    from hvdlab.torch.modes import train_modes

    runs = train_modes(Config.from_dict(BASE).to_dict(), MODES, trace=True)
    for r in runs.values():
        r.pop("params")
    return {"rank": hvd.rank(), "size": hvd.size(), "runs": runs, "user": _user_loop_torch()}


def run_tensorflow():
    import horovod.tensorflow as hvd

    from hvdsync.config import Config
    from hvdlab.tensorflow.modes import train_modes

    runs = train_modes(Config.from_dict({**BASE, "train": {**BASE["train"], "framework": "tensorflow"}}).to_dict(),
                       MODES, trace=True)
    return {"rank": hvd.rank(), "size": hvd.size(), "runs": runs, "user": _user_fit_keras()}


def _user_fit_keras(steps=12, period=4):
    """The user's own Keras model, loss and optimizer through compile/fit with a local_sgd optimizer."""
    import horovod.tensorflow as hvd
    import keras

    import hvdsync.tensorflow as hs
    from hvdsync.config import SyncConfig

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(3)])
    opt = hs.distributed_optimizer(keras.optimizers.SGD(0.05, momentum=0.9), model,
                                   SyncConfig(mode="local_sgd", period=period))
    model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=False)
    hs.broadcast_state(model, opt)
    rng = np.random.default_rng(100 + hvd.rank())                 # each rank its own data
    x, y = rng.normal(size=(16 * steps, 8)).astype("float32"), rng.integers(0, 3, 16 * steps)
    fingerprints = []

    class Trace(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            fingerprints.append(float(sum(np.sum(np.asarray(v) * (i + 1)) for i, v in enumerate(model.weights))))

    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[Trace()])
    return {"rounds": opt.rounds, "fingerprints": fingerprints}
