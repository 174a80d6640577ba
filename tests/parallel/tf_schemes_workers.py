"""Runs inside each of 2 Horovod workers (sent by value): TensorFlow's sync modes beside its all-reduce on one pair of
workers (mirrors tests/parallel/schemes_workers.py for PyTorch), and one round of each against the numpy simulation.

tests/parallel/test_tf_schemes.py asserts on the numbers.
"""
import numpy as np

BASE = {"train": {"seed": 5, "epochs": 3, "hidden": 32, "lr": 0.1, "framework": "tensorflow"},
        "data": {"batch_size": 32}, "tracking": {"enabled": False}}
MODES = {"allreduce": {}, "ps_sharded": {"mode": "ps"}, "ps_single": {"mode": "ps", "ps_servers": 1},
         "ps_fp16": {"mode": "ps", "compression": "fp16"}, "gossip": {"mode": "gossip"},
         "gossip_h4": {"mode": "gossip", "period": 4}}


def _one_round(mode, rank, lr=0.5, servers=0):
    """One step of ``mode`` on fixed rank-specific parameters and gradients (a Dense layer of 5 x 3 + 3 = 18
    parameters); returns what the collective made, beside the start and the gradient, flattened."""
    import keras

    import hvdsync.tensorflow as hs
    from hvdsync.config import SyncConfig

    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(3)])
    rng = np.random.default_rng(11)
    base = [rng.normal(size=v.shape) for v in model.trainable_variables]
    grads = [rng.normal(size=v.shape) * (rank + 1) for v in model.trainable_variables]
    start = [b + (rank if mode == "gossip" else 0) for b in base]  # gossip mixes *different* parameters
    for v, s in zip(model.trainable_variables, start):
        v.assign(s.astype(np.float32))
    opt = hs.distributed_optimizer(keras.optimizers.SGD(lr), model, SyncConfig(mode=mode, ps_servers=servers))
    opt.broadcast_done = True  # rank-specific parameters on purpose: no broadcast of rank 0's before the round
    opt.accumulate([g.astype(np.float32) for g in grads], model.trainable_variables, fresh=True)
    opt.synchronize()
    opt.step()
    flat = lambda xs: np.concatenate([np.asarray(x, dtype=np.float64).ravel() for x in xs])  # noqa: E731
    return {"after": flat([v.numpy() for v in model.trainable_variables]), "traffic": opt.traffic,
            "start": flat(start), "grad": flat(grads)}


def run_checks():
    import horovod.tensorflow as hvd

    from hvdsync.config import Config
    from hvdlab.tensorflow.modes import train_modes

    runs = train_modes(Config.from_dict(BASE).to_dict(), MODES)
    rounds = {"gossip": _one_round("gossip", hvd.rank()), "ps0": _one_round("ps", hvd.rank(), servers=0),
              "ps1": _one_round("ps", hvd.rank(), servers=1)}
    return {"rank": hvd.rank(), "size": hvd.size(), "runs": runs, "rounds": rounds,
            "shards": {servers: _shards(servers) for servers in (0, 1)}}


def _shards(servers):
    """Where a parameter server's state lives: the shapes of this rank's sharded variables (its shard, the pushed
    gradient, Adam's two moments) and of the replicated ones, for a Dense layer of 18 parameters, after two steps."""
    import keras

    import hvdsync.tensorflow as hs
    from hvdsync.config import SyncConfig

    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(3)])
    opt = hs.distributed_optimizer(keras.optimizers.Adam(0.1), model, SyncConfig(mode="ps", ps_servers=servers))
    hs.broadcast_state(model, opt)  # by position over opt.variables: equal shapes on every rank, or it fails
    for _ in range(2):
        opt.apply([np.ones(v.shape, np.float32) for v in model.trainable_variables], model.trainable_variables)
    return {"sharded": sorted((v.path.split("/")[-1], tuple(v.shape)) for v in opt.shard_variables),
            "replicated": [tuple(v.shape) for v in opt.variables], "iterations": int(opt.iterations.numpy()),
            "rounds": opt.rounds, "params": [v.numpy() for v in model.trainable_variables]}
