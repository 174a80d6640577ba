"""Durable, checksummed checkpoints: what survives a lost *job* (the elastic state survives a lost *worker*).

A checkpoint is a folder ``ckpt-<step>`` holding opaque files (the adapter's bytes: a ``torch.save`` of the state
dicts, an ``.npz`` of Keras variables) and ``manifest.json`` (step, model fingerprint, the job that wrote it,
metadata, and the size and SHA-256 of every file). Writing is atomic: everything goes into a hidden temporary folder, each file is fsynced,
the manifest is written *last*, then the folder is renamed into place and the parent folder fsynced. A crash at any
moment leaves either the previous checkpoints or a complete new one, never a half-written ``ckpt-*``.

Reading picks the newest checkpoint that passes every check. Each one that fails is reported in one line naming the
file (truncated, altered, missing manifest, from another model), and the next older one is tried; with none left
the caller starts fresh and says so. Nothing here unpickles: the manifest is JSON and the payload is checked bytes
that the adapter decodes without running code (``torch.load(weights_only=True)``, ``numpy.load(allow_pickle=False)``).

A checkpoint folder belongs to one job. The manifest records the job (``job.id``, made at the job's first start and
kept across its elastic resets and resumes, and ``job.config``, the settings a job that continues it must share:
:mod:`hvdsync.core.elastic.jobs`). Pruning keeps the last ``keep`` checkpoints *of this job and this model* and
never touches another's; a step another job wrote is not overwritten. Which job may write into a folder, and which
one ``resume`` continues, is decided before the workers start (:func:`hvdsync.core.elastic.jobs.claim`).

The store is rank-agnostic: the elastic state lets rank 0 write, and any rank can read.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hvdsync.core._moved import to_adapters

MANIFEST = "manifest.json"
PREFIX = "ckpt-"
FORMAT = 1


class CheckpointError(ValueError):
    """A checkpoint failed a check; the message is one line naming the file."""


def undecodable(name: str, exc: BaseException) -> CheckpointError:
    """A payload that passed its checksum but does not decode (the adapter's ``from_files``), as one line naming the
    file: such a checkpoint is skipped like a damaged one. Exceptions of ``torch.load`` and ``numpy.load`` can span
    many lines; only the first is kept."""
    text = (str(exc).strip().splitlines() or [""])[0][:160]
    return CheckpointError(f"{name}: does not load ({type(exc).__name__}: {text})")


def _say(line: str) -> None:
    print(f"hvdsync: {line}", file=sys.stderr, flush=True)


@dataclass
class Checkpoint:
    """A verified checkpoint: its files' bytes (already checked against the manifest) and its metadata."""

    path: Path
    step: int
    meta: dict[str, Any]
    files: dict[str, bytes] = field(repr=False)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def config_fingerprint(config: Mapping[str, Any]) -> str:
    """A short hash of a job's recorded settings (sorted JSON): equal settings, equal fingerprint."""
    return _sha256(json.dumps(dict(config), sort_keys=True, default=str).encode())[:16]


def _fsync_dir(path: Path) -> None:
    # A rename is durable only once the folder holding the new name is on disk.
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


# CheckpointStore is the adapters' public name; its definition lives in the private _store (which hvdsync imports),
# so this path warns for it, naming the adapter, until 0.4.0. The format, its checks and errors stay here.
__getattr__ = to_adapters(__name__, {"CheckpointStore": "hvdsync.core.elastic._store"}, until="0.4.0")
