"""The small models the examples, tests and notebooks train (Keras 3)."""
from __future__ import annotations

import keras


def mlp(n_features: int, hidden: int, n_classes: int) -> keras.Model:
    """A one-hidden-layer perceptron returning logits: enough for >= 0.9 test accuracy on digits in a few seconds."""
    return keras.Sequential([keras.Input((n_features,)), keras.layers.Dense(hidden, activation="relu"),
                             keras.layers.Dense(n_classes)])


def local_optimizer(cfg, model: keras.Model, lr: float) -> keras.optimizers.Optimizer:
    """The per-rank optimizer that :func:`hvdsync.tensorflow.distributed_optimizer` wraps, already built over
    ``model``'s variables (Keras 3 would otherwise create its slot variables lazily, at the first update)."""
    if cfg.train.optimizer == "adam":
        optimizer = keras.optimizers.Adam(learning_rate=lr)
    else:
        optimizer = keras.optimizers.SGD(learning_rate=lr, momentum=cfg.train.momentum)
    optimizer.build(model.trainable_variables)
    return optimizer


def build_mlp(cfg, data) -> keras.Model:
    """``train.model: mlp`` (:mod:`hvdsync.registry`): ``train.hidden`` units; image samples are flattened first."""
    model = mlp(data.n_features, cfg.train.hidden, data.n_classes)
    if len(data.input_shape) == 1:
        return model
    return keras.Sequential([keras.Input(data.input_shape), keras.layers.Flatten(), *model.layers])
