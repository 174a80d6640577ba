"""Bundled data sets as numpy arrays, the same for both frameworks (registered by name in :mod:`hvdsync.registry`;
:func:`hvdsync.datasets.load` loads the one a config names).

* ``digits``: scikit-learn's bundled 8x8 handwritten digits (1,797 real images that ship inside the package, no
  download), scaled to [0, 1], as 64 features.
* ``digits_images``: the same digits as images, shape ``(8, 8, 1)``.
* ``synthetic``: Gaussian class clusters made from the seed, any size; for benchmarks and large-step tests.
* ``synthetic_images``: images of any size and channel count made from the seed: each class is a smooth pattern
  plus noise, so a convolutional network learns it and a linear model learns it less well.

Images are stored ``(N, height, width, channels)`` (the layout of image files and Keras' default); the PyTorch CNN
takes that layout and moves the channels itself. The train/test split is a seeded permutation, so every rank (and
every framework) sees the same split.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Dataset:
    """Train and test arrays; ``x`` of any sample shape, ``y`` integer class labels."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    n_classes: int

    @property
    def input_shape(self) -> tuple[int, ...]:
        """The shape of one sample (``(64,)`` for digits, ``(8, 8, 1)`` for digits as images)."""
        return tuple(int(d) for d in self.x_train.shape[1:])

    @property
    def n_features(self) -> int:
        """Numbers per sample (the input width of an MLP)."""
        return int(np.prod(self.input_shape))


def _split(x: np.ndarray, y: np.ndarray, test_fraction: float, seed: int, n_classes: int) -> Dataset:
    order = np.random.default_rng([seed, 7919]).permutation(len(x))
    n_test = max(1, int(round(len(x) * test_fraction)))
    test, train = order[:n_test], order[n_test:]
    return Dataset(x[train], y[train], x[test], y[test], n_classes)


def digits(test_fraction: float = 0.25, seed: int = 0, images: bool = False) -> Dataset:
    """scikit-learn's digits: 1,797 samples, 64 pixel intensities (0..16 scaled to 0..1), 10 classes; as
    ``(8, 8, 1)`` images when ``images``."""
    pixels, labels = _digits_arrays()
    x = (pixels / 16.0).astype(np.float32)
    if images:
        x = x.reshape(-1, 8, 8, 1)
    return _split(x, labels.astype(np.int64), test_fraction, seed, 10)


def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """(pixels, labels) as scikit-learn's ``load_digits`` returns them, read from the CSV file scikit-learn ships
    (``sklearn/datasets/data/digits.csv.gz``: 64 pixels then the label per row) without importing scikit-learn.
    Importing it (and SciPy beneath it) costs every worker 1-1.5 s of CPU, more than a short job's whole data path;
    reading the file takes ~20 ms. Where this scikit-learn keeps the file elsewhere, scikit-learn loads it."""
    spec = importlib.util.find_spec("sklearn")   # finds the package without running it
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            table = np.loadtxt(path, delimiter=",")
            return table[:, :-1], table[:, -1].astype(int)
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return bunch.data, bunch.target


def synthetic(samples: int = 4096, features: int = 64, classes: int = 10, test_fraction: float = 0.25,
              seed: int = 0, spread: float = 1.5) -> Dataset:
    """Gaussian clusters, one per class, with unit noise: learnable, but not trivially. ``spread`` is the centres'
    standard deviation: two centres lie ~spread * sqrt(2 features) apart, so with many features a small spread
    still separates the classes, and a task on which codecs differ in accuracy needs one well below 1."""
    rng = np.random.default_rng([seed, 104729])
    centres = rng.normal(0.0, spread, size=(classes, features)).astype(np.float32)
    y = rng.integers(0, classes, size=samples).astype(np.int64)
    x = (centres[y] + rng.normal(0.0, 1.0, size=(samples, features))).astype(np.float32)
    return _split(x, y, test_fraction, seed, classes)


def synthetic_images(samples: int = 1024, size: int = 16, channels: int = 3, classes: int = 10,
                     test_fraction: float = 0.25, seed: int = 0, noise: float = 0.5) -> Dataset:
    """``samples`` images of ``size x size x channels``: class ``c`` is a seeded sum of two plane waves (a texture),
    shifted by a random offset per image, plus Gaussian noise of standard deviation ``noise``.

    The random shift is what makes it an image task: a texture moved by a few pixels is the same class, which
    convolutions (shared weights over positions) handle naturally.
    """
    rng = np.random.default_rng([seed, 15485863])
    freq = rng.uniform(0.5, 2.5, size=(classes, 2, 2)) * (2 * np.pi / size)   # (class, wave, [fy, fx])
    phase = rng.uniform(0, 2 * np.pi, size=(classes, 2, channels))
    y = rng.integers(0, classes, size=samples).astype(np.int64)
    shift = rng.integers(0, size, size=(samples, 2))
    r = np.arange(size, dtype=np.float64)
    rows = r[None, :] + shift[:, :1]                                           # (N, H)
    cols = r[None, :] + shift[:, 1:]                                           # (N, W)
    x = np.zeros((samples, size, size, channels), dtype=np.float64)
    for w in range(2):
        fy, fx = freq[y, w, 0], freq[y, w, 1]                                  # (N,)
        arg = (fy[:, None, None] * rows[:, :, None] + fx[:, None, None] * cols[:, None, :])[..., None]
        x += np.sin(arg + phase[y, w][:, None, None, :])
    x = x / 2 + rng.normal(0.0, noise, size=x.shape)
    return _split(x.astype(np.float32), y, test_fraction, seed, classes)


# Loaders with the signature the data-set registry expects: ``load(data_cfg, seed) -> Dataset``.
def load_digits(data_cfg, seed: int = 0) -> Dataset:
    return digits(data_cfg.test_fraction, seed)


def load_digits_images(data_cfg, seed: int = 0) -> Dataset:
    return digits(data_cfg.test_fraction, seed, images=True)


def load_synthetic(data_cfg, seed: int = 0) -> Dataset:
    return synthetic(data_cfg.synthetic_samples, data_cfg.synthetic_features, data_cfg.synthetic_classes,
                     data_cfg.test_fraction, seed, data_cfg.synthetic_spread)


def load_synthetic_images(data_cfg, seed: int = 0) -> Dataset:
    return synthetic_images(data_cfg.synthetic_samples, data_cfg.image_size, data_cfg.image_channels,
                            data_cfg.synthetic_classes, data_cfg.test_fraction, seed)

