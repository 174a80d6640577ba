"""Sync modes side by side on TensorFlow/Keras 3 (mirrors :mod:`hvdlab.torch.modes`)."""
from __future__ import annotations

import keras

from hvdlab import modes
from hvdsync.tensorflow.runtime import init
from hvdsync.tensorflow.train import build


def train_modes(cfg_dict: dict, runs: dict[str, dict], trace: bool = False) -> dict[str, dict]:
    """Train the same Keras model from the same start once per entry of ``runs`` in this worker (mirrors
    :func:`hvdlab.torch.modes.train_modes`; returns :func:`hvdlab.modes.train_modes`).

    Example::

        out = launch.run(train_modes, args=(cfg.to_dict(), {"sync": {}, "h4": {"mode": "local_sgd", "period": 4}}),
                         np=2)[0]
    """
    return modes.train_modes(cfg_dict, runs, init, build, keras.utils.set_random_seed, trace=trace)
