"""A user's own training script, started by whatever launcher the test uses (mpirun, horovodrun --mpi):
``python tests/slurm/params_job.py torch|keras OUT``. Each rank writes its final parameters, its rank, size and host
to ``OUT/rank<r>.json``, so runs under different controllers can be compared parameter by parameter.

``python tests/slurm/params_job.py torch|keras OUT --gloo KEY``: the same job on node1:2,node2:2 with Gloo, started by
hvdsync's launcher (:func:`hvdsync.launch.run`, which asks the binaries, not a TensorFlow import, whether Gloo is
built: a shorter start than horovodrun's)."""
import json
import os
import socket
import sys
from pathlib import Path

SEED, EPOCHS, BATCH = 3, 2, 16


def torch_job():
    import horovod.torch as hvd
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    import hvdsync.torch as hs
    from hvdsync.config import Config
    from hvdsync.core.train.data import digits

    cfg = Config.from_dict({"data": {"batch_size": BATCH}, "train": {"seed": SEED, "epochs": EPOCHS, "lr": 0.05},
                            "tracking": {"enabled": False}})
    hs.init(cfg)
    split = digits(seed=SEED)
    train = TensorDataset(torch.from_numpy(split.x_train), torch.from_numpy(split.y_train))
    loader = DataLoader(train, batch_sampler=hs.PlanSampler.from_config(cfg, train))
    torch.manual_seed(SEED)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    result = hs.fit(cfg, model=model, loss=nn.CrossEntropyLoss(), train=loader,
                    optimizer=torch.optim.SGD(model.parameters(), lr=cfg.train.lr))
    params = torch.cat([p.detach().flatten() for p in model.parameters()]).double().tolist()
    return hvd.rank(), hvd.size(), params, result.param_spread


def keras_job():
    import hvdsync.tensorflow as hs  # first: it keeps TensorFlow's start-up lines out of the log
    import keras
    import numpy as np
    import tensorflow as tf

    from hvdsync.config import Config
    from hvdsync.core.train.data import digits

    cfg = Config.from_dict({"data": {"batch_size": BATCH}, "train": {"framework": "tensorflow", "seed": SEED,
                                                                     "epochs": EPOCHS}, "tracking": {"enabled": False}})
    info = hs.init(cfg)
    split = digits(seed=SEED)
    x, y = tf.constant(split.x_train, tf.float32), tf.constant(split.y_train, tf.int64)
    keras.utils.set_random_seed(SEED)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10)])
    model.compile(optimizer=hs.distributed_optimizer(keras.optimizers.SGD(0.05), sync=cfg.sync),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False)
    sampler = hs.PlanSampler.from_config(cfg, len(split.y_train))
    stream = sampler.dataset(lambda i: (tf.gather(x, i), tf.gather(y, i)))
    model.fit(stream, epochs=EPOCHS, callbacks=[sampler, *hs.callbacks.standard_callbacks(cfg)], shuffle=False,
              verbose=0)
    params = np.concatenate([w.ravel() for w in model.get_weights()]).astype(float).tolist()
    return info.rank, info.size, params, None


def main(framework: str, out: str) -> None:
    rank, size, params, spread = torch_job() if framework == "torch" else keras_job()
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / f"rank{rank}.json").write_text(json.dumps({"rank": rank, "size": size, "host": socket.gethostname(),
                                                            "controller": os.environ.get("HOROVOD_CONTROLLER", ""),
                                                            "params": params, "param_spread": spread}))


if __name__ == "__main__":
    if "--gloo" in sys.argv:
        from hvdsync.launch import run

        run(main, args=tuple(sys.argv[1:3]), np=4, hosts="node1:2,node2:2", progress=False,
            ssh_identity_file=sys.argv[sys.argv.index("--gloo") + 1], network_interfaces=["hv0"])
    else:
        main(*sys.argv[1:3])
