"""Evaluation of a user's test set for the shared loop: each rank scores its share, the loop adds them up (mirrors
``hvdsync/torch/evaluate.py``)."""
from __future__ import annotations

from typing import Callable, Sequence

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf

from hvdsync.core.train.shares import share_slice


def dataset_evaluator(model: keras.Model, dataset, batch_size: int = 256,
                      shares: Callable[[], Sequence[float] | None] | None = None) -> Callable[[], dict]:
    """``evaluate()`` for :func:`hvdsync.core.train.loop.fit_loop`: accuracy of ``model`` (argmax of its outputs) on
    ``dataset``: a pair of arrays ``(x, y)``, or an unbatched ``tf.data.Dataset`` of ``(input, label)`` samples of
    known length. Each rank scores its contiguous part, cut by ``shares()`` (the shares of the training steps in
    force; ``None`` or no ``shares``: equal parts); it returns ``{"test_accuracy": (correct, count)}`` and the loop
    sums both over ranks, so the figure is over the whole set. The same arguments as
    :func:`hvdsync.torch.dataset_evaluator`."""
    if isinstance(dataset, tf.data.Dataset):
        size = int(dataset.cardinality())
        if size < 0:
            raise ValueError("dataset: a tf.data.Dataset of unknown length is not allowed; each rank scores its "
                             "share of the samples, so the length must be known (e.g. Dataset.from_tensor_slices)")
    else:
        x, y = dataset
        size = len(y)
    # Traced once (any batch size): Keras' eager call runs op by op (see TensorFlowBackend.count_correct).
    predict = tf.function(lambda v: tf.argmax(model(v, training=False), axis=1), reduce_retracing=True)

    def evaluate() -> dict:
        part = share_slice(size, hvd.rank(), hvd.size(), shares() if shares is not None else None)
        if isinstance(dataset, tf.data.Dataset):
            batches = dataset.skip(part.start).take(part.stop - part.start).batch(batch_size)
        else:
            batches = ((x[i:min(i + batch_size, part.stop)], y[i:min(i + batch_size, part.stop)])
                       for i in range(part.start, part.stop, batch_size))
        correct, count = 0, 0
        for xb, yb in batches:
            correct += int(np.sum(predict(xb).numpy() == np.asarray(yb)))
            count += len(yb)
        return {"test_accuracy": (correct, count)}

    return evaluate
