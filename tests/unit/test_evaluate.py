"""Both adapters' ``dataset_evaluator`` (one signature: hvdsync.adapter) score this rank's part of a user's test set,
cut by the shares in force, and count what the model gets right there. Rank and world size are stubbed: no Horovod
job is needed to cut a test set."""
from __future__ import annotations

import numpy as np
import pytest

N, FEATURES, CLASSES = 23, 4, 3


def _problem():
    rng = np.random.default_rng(5)
    x = rng.normal(size=(N, FEATURES)).astype(np.float32)
    w = rng.normal(size=(FEATURES, CLASSES)).astype(np.float32)
    y = rng.integers(0, CLASSES, size=N).astype(np.int64)
    return x, y, w, np.argmax(x @ w, axis=1)


def _as_rank(monkeypatch, module, rank: int, size: int = 2) -> None:
    monkeypatch.setattr(module.hvd, "rank", lambda: rank)
    monkeypatch.setattr(module.hvd, "size", lambda: size)


@pytest.mark.parametrize("shares", [None, (0.25, 0.75)])
def test_torch_scores_this_ranks_share_of_a_dataset(monkeypatch, shares):
    import torch
    from torch.utils.data import TensorDataset

    from hvdsync.core.train.shares import share_slice
    from hvdsync.torch import evaluate

    x, y, w, predicted = _problem()
    model = torch.nn.Linear(FEATURES, CLASSES, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.from_numpy(w.T.copy()))
    data = TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
    got = []
    for rank in (0, 1):
        _as_rank(monkeypatch, evaluate, rank)
        part = share_slice(N, rank, 2, shares)
        result = evaluate.dataset_evaluator(model, data, batch_size=5, shares=lambda: shares)()
        assert result == {"test_accuracy": (int(np.sum(predicted[part] == y[part])), part.stop - part.start)}
        got.append(result["test_accuracy"])
    assert sum(c for _, c in got) == N  # the ranks' parts cover the test set once


@pytest.mark.parametrize("shares", [None, (0.25, 0.75)])
def test_tensorflow_scores_this_ranks_share_of_arrays_or_a_tf_data_set(monkeypatch, shares):
    import keras
    import tensorflow as tf

    from hvdsync.core.train.shares import share_slice
    from hvdsync.tensorflow import evaluate

    x, y, w, predicted = _problem()
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(CLASSES, use_bias=False)])
    model.set_weights([w])
    got = []
    for rank in (0, 1):
        _as_rank(monkeypatch, evaluate, rank)
        part = share_slice(N, rank, 2, shares)
        want = {"test_accuracy": (int(np.sum(predicted[part] == y[part])), part.stop - part.start)}
        for data in ((x, y), tf.data.Dataset.from_tensor_slices((x, y))):
            assert evaluate.dataset_evaluator(model, data, batch_size=5, shares=lambda: shares)() == want
        got.append(want["test_accuracy"])
    assert sum(c for _, c in got) == N


def test_tensorflow_refuses_a_tf_data_set_of_unknown_length():
    import tensorflow as tf

    from hvdsync.tensorflow import evaluate

    endless = tf.data.Dataset.from_tensor_slices(([[0.0]], [0])).repeat().filter(lambda a, b: True)
    with pytest.raises(ValueError, match=r"^dataset: a tf.data.Dataset of unknown length is not allowed"):
        evaluate.dataset_evaluator(None, endless)
