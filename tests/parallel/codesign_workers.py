"""Runs inside 2 Horovod workers (sent by value): notebook 17's co-design measurements, small, for either framework.

tests/parallel/test_codesign.py asserts on the numbers.
"""
import importlib
import json


def all_checks(framework: str) -> dict:
    """The 100k-row embedding table with sync.sparse allgather and dense (codec none, then fp16), dense under
    top-k (a reducing codec on a densified sparse gradient), batch-norm statistics of an uneven split, and the
    framework's other path: PyTorch's other sync modes, Keras compile/fit."""
    codesign = importlib.import_module(f"hvdlab.{framework}.codesign")
    out = {"none": codesign.embedding_exchange(steps=3),
           "fp16": codesign.embedding_exchange(steps=2, compression="fp16"),
           "topk": codesign.embedding_exchange(steps=2, compression="topk:0.01", modes=("dense",)),
           "bn": codesign.batchnorm_statistics(rows=(5, 3))}
    out["other"] = torch_modes() if framework == "torch" else keras_fit(steps=3)
    return out


def torch_modes() -> dict:
    """A sparse embedding gradient (sync.sparse dense) under the parameter server, local SGD and a reducing codec:
    the parameters' spread across ranks after 4 steps of each."""
    import horovod.torch as hvd
    import torch
    from torch import nn

    from hvdsync.config import Config
    from hvdlab import embedding
    from hvdlab.torch.codesign import EmbeddingRegressor, _spread
    from hvdsync.torch.optimizer import broadcast_state, distributed_optimizer

    out = {}
    for sync in ({"mode": "ps"}, {"mode": "ps", "ps_servers": 1}, {"mode": "local_sgd", "period": 1},
                 {"compression": "int8"}):
        torch.manual_seed(0)
        model = EmbeddingRegressor(1000, 8)
        opt = distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1), model,
                                    Config.from_dict({"sync": sync}).sync)
        broadcast_state(model, opt)
        for step in range(4):
            ids = torch.from_numpy(embedding.draw_lookups(1000, 40, step, hvd.rank()))
            opt.zero_grad()
            nn.functional.mse_loss(model(ids), torch.ones(len(ids))).backward()
            opt.step()
        out[json.dumps(sync, sort_keys=True)] = _spread([p.detach() for p in model.parameters()])
    return out


def keras_fit(steps: int) -> dict:
    """The embedding model of the exchange through Keras compile/fit with sync.sparse allgather, on the same ids."""
    import horovod.tensorflow as hvd
    import keras
    import numpy as np

    import hvdsync.tensorflow as hs
    from hvdlab import embedding
    from hvdsync.core.comm.codecs import WireCounter
    from hvdlab.tensorflow.codesign import _spread, embedding_model

    keras.utils.set_random_seed(0)
    model = embedding_model(100_000, 16)
    counter = WireCounter()
    opt = hs.distributed_optimizer(keras.optimizers.SGD(0.5), model, sparse="allgather", counter=counter)
    hs.broadcast_state(model, opt)
    model.compile(optimizer=opt, loss="mse", jit_compile=False)
    ids = np.concatenate([embedding.draw_lookups(100_000, 300, s, hvd.rank()) for s in range(steps)])
    y = np.zeros(len(ids), np.float32)
    model.fit(ids, y, batch_size=len(ids) // steps, epochs=1, shuffle=False, verbose=0)
    return {"bytes": counter.bytes, "dtypes": sorted(counter.dtypes),
            "spread": _spread([v.value for v in model.trainable_variables])}
