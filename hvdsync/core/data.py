"""Datasets as numpy arrays, the same for both frameworks.

* ``digits``: scikit-learn's bundled 8x8 handwritten digits (1,797 real images that ship inside the package, no
  download), scaled to [0, 1].
* ``synthetic``: Gaussian class clusters made from the seed, any size; for benchmarks and large-step tests.
The train/test split is a seeded permutation, so every rank (and every framework) sees the same split.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Dataset:
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    n_classes: int

    @property
    def n_features(self) -> int:
        return int(self.x_train.shape[1])


def _split(x: np.ndarray, y: np.ndarray, test_fraction: float, seed: int, n_classes: int) -> Dataset:
    order = np.random.default_rng([seed, 7919]).permutation(len(x))
    n_test = max(1, int(round(len(x) * test_fraction)))
    test, train = order[:n_test], order[n_test:]
    return Dataset(x[train], y[train], x[test], y[test], n_classes)


def digits(test_fraction: float = 0.25, seed: int = 0) -> Dataset:
    """scikit-learn's digits: 1,797 samples, 64 features (pixel intensities 0..16 scaled to 0..1), 10 classes."""
    from sklearn.datasets import load_digits  # imported here: only this dataset needs scikit-learn

    bunch = load_digits()
    x = (bunch.data / 16.0).astype(np.float32)
    y = bunch.target.astype(np.int64)
    return _split(x, y, test_fraction, seed, 10)


def synthetic(samples: int = 4096, features: int = 64, classes: int = 10, test_fraction: float = 0.25,
              seed: int = 0) -> Dataset:
    """Gaussian clusters, one per class, with unit noise: learnable, but not trivially."""
    rng = np.random.default_rng([seed, 104729])
    centres = rng.normal(0.0, 1.5, size=(classes, features)).astype(np.float32)
    y = rng.integers(0, classes, size=samples).astype(np.int64)
    x = (centres[y] + rng.normal(0.0, 1.0, size=(samples, features))).astype(np.float32)
    return _split(x, y, test_fraction, seed, classes)


def load(data_cfg, seed: int = 0) -> Dataset:
    """The dataset a :class:`hvdsync.config.DataConfig` names."""
    if data_cfg.dataset == "digits":
        return digits(data_cfg.test_fraction, seed)
    if data_cfg.dataset == "synthetic":
        return synthetic(data_cfg.synthetic_samples, data_cfg.synthetic_features, data_cfg.synthetic_classes,
                         data_cfg.test_fraction, seed)
    raise ValueError(f"data.dataset: {data_cfg.dataset!r} is not allowed; choose one of: digits, synthetic")
