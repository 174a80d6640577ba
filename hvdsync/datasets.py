"""The data sets a config can name: :func:`load` looks ``cfg.data.name`` up in :mod:`hvdsync.registry` (where users
register theirs); the bundled ones and :class:`Dataset` itself live in :mod:`hvdsync.core.train.data`.

Example:
    >>> from hvdsync import Config, datasets
    >>> data = datasets.load(Config().data, seed=0)   # scikit-learn's digits, split by the seed
    >>> data.x_train.shape[1]
    64
"""
from __future__ import annotations

from hvdsync.core.train.data import (
    Dataset,
    digits,
    load_digits,
    load_digits_images,
    load_synthetic,
    load_synthetic_images,
    synthetic,
    synthetic_images,
)
from hvdsync.registry import load_dataset


def load(data_cfg, seed: int = 0) -> Dataset:
    """The data set a :class:`hvdsync.config.DataConfig` names (looked up in :mod:`hvdsync.registry`)."""
    return load_dataset(data_cfg, seed)


__all__ = ["Dataset", "load", "digits", "synthetic", "synthetic_images", "load_digits", "load_digits_images",
           "load_synthetic", "load_synthetic_images"]
