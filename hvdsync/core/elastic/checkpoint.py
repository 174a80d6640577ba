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
import shutil
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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


class CheckpointStore:
    """Atomic checkpoints in ``directory``, the last ``keep`` kept; the newest valid one wins on load.

    Args:
        directory: the checkpoint folder (created on the first save).
        keep: how many checkpoints to keep (older ones are removed after a successful save).
        fingerprint: identifies the model (e.g. a hash of parameter names, shapes and dtypes); a checkpoint with
            another fingerprint is skipped as "from another model". Empty: not checked.
        report: where one-line reports go (default: stderr with an ``hvdsync:`` prefix).
        job_id: the job writing (recorded in each manifest; pruning only ever removes this job's checkpoints).
            Empty: a store that records no job (then it prunes only checkpoints that record none either).
        job_config: the settings recorded with the job (what a resumed job must share with it).

    Example:
        >>> store = CheckpointStore("ckpts", keep=3, fingerprint="mlp-64")          # doctest: +SKIP
        >>> store.save(10, {"model.pt": b"..."}, {"epoch": 0, "consumed": 640})   # doctest: +SKIP
        >>> ckpt = store.latest()   # None (and a line saying so) when nothing valid is there  # doctest: +SKIP
    """

    def __init__(self, directory: str | Path, keep: int = 3, fingerprint: str = "",
                 report: Callable[[str], None] | None = None, job_id: str = "",
                 job_config: Mapping[str, Any] | None = None) -> None:
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValueError(f"keep: {keep!r} is not allowed; expected an integer >= 1")
        self.directory = Path(directory)
        self.keep = keep
        self.fingerprint = fingerprint
        self.report = report or _say
        self.job_id = job_id
        self.job_config = dict(job_config or {})

    # ---- writing --------------------------------------------------------------------------------------------------
    def save(self, step: int, files: Mapping[str, bytes], meta: Mapping[str, Any] | None = None) -> Path:
        """Write checkpoint ``step`` atomically and prune to the last ``keep``; returns its folder."""
        self.directory.mkdir(parents=True, exist_ok=True)
        final = self.directory / f"{PREFIX}{step:09d}"
        if final.exists() and not self.is_mine(final):
            raise CheckpointError(f"{final}: written by another job ({self.owner(final) or 'no job recorded'}); "
                                  "not overwritten")
        tmp = self.directory / f"{self._tmp_prefix()}{PREFIX}{step:09d}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        entries = {}
        for name, data in files.items():
            if "/" in name or name in (MANIFEST, "", ".", ".."):
                raise ValueError(f"checkpoint file name: {name!r} is not allowed; expected a plain file name")
            _write_synced(tmp / name, data)
            entries[name] = {"bytes": len(data), "sha256": _sha256(data)}
        manifest = {"format": FORMAT, "step": int(step), "fingerprint": self.fingerprint,
                    "meta": dict(meta or {}), "files": entries}
        if self.job_id:
            manifest["job"] = {"id": self.job_id, "config": self.job_config,
                               "config_fingerprint": config_fingerprint(self.job_config)}
        # The manifest last: a folder with a manifest has every file the manifest names, complete.
        _write_synced(tmp / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True).encode())
        _fsync_dir(tmp)
        if final.exists():  # the same step committed again after a restore: replace it
            old = self.directory / f".old-{final.name}-{os.getpid()}"
            os.rename(final, old)
            os.rename(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, final)
        _fsync_dir(self.directory)
        self._prune()
        return final

    def _tmp_prefix(self) -> str:
        # The job in the name: a writer cleans up only what a killed writer *of its own job* left behind.
        return f".tmp-{self.job_id}-" if self.job_id else ".tmp-"

    def _prune(self) -> None:
        # Only this job's checkpoints of this model: another job's (or another model's, or one whose manifest does
        # not say whose it is) is never removed, whatever its step.
        for old in [p for p in self.candidates() if self.is_mine(p)][self.keep:]:
            shutil.rmtree(old, ignore_errors=True)
        for stale in self.directory.glob(f"{self._tmp_prefix()}{PREFIX}*"):  # left by a writer killed mid-save
            if not stale.name.endswith(f"-{os.getpid()}"):
                shutil.rmtree(stale, ignore_errors=True)

    # ---- ownership --------------------------------------------------------------------------------------------------
    def manifest(self, path: str | Path) -> dict | None:
        """The manifest of one checkpoint folder as JSON, unchecked; None when missing or unreadable."""
        try:
            manifest = json.loads((Path(path) / MANIFEST).read_bytes())
        except (OSError, ValueError):
            return None
        return manifest if isinstance(manifest, dict) else None

    def owner(self, path: str | Path) -> str:
        """The id of the job that wrote a checkpoint ("" when its manifest records none or cannot be read)."""
        job = (self.manifest(path) or {}).get("job")
        return str(job.get("id", "")) if isinstance(job, dict) else ""

    def is_mine(self, path: str | Path) -> bool:
        """Whether a checkpoint was written by this store's job and model (only those are pruned or replaced)."""
        manifest = self.manifest(path)
        if manifest is None:
            return False
        job = manifest.get("job")
        job_id = str(job.get("id", "")) if isinstance(job, dict) else ""
        return job_id == self.job_id and manifest.get("fingerprint", "") == self.fingerprint

    # ---- reading --------------------------------------------------------------------------------------------------
    def candidates(self) -> list[Path]:
        """Checkpoint folders, newest (highest step) first; not yet verified."""
        if not self.directory.is_dir():
            return []
        found = []
        for p in self.directory.iterdir():
            suffix = p.name[len(PREFIX):]
            if p.is_dir() and p.name.startswith(PREFIX) and suffix.isdigit():
                found.append((int(suffix), p))
        return [p for _, p in sorted(found, reverse=True)]

    def verify(self, path: str | Path) -> Checkpoint:
        """Read and check one checkpoint; raises :class:`CheckpointError` with one line naming the bad file."""
        path = Path(path)
        manifest_path = path / MANIFEST
        if not manifest_path.is_file():
            raise CheckpointError(f"{manifest_path}: missing (an unfinished or damaged checkpoint)")
        try:
            manifest = json.loads(manifest_path.read_bytes())
            step, files, fingerprint = int(manifest["step"]), dict(manifest["files"]), manifest["fingerprint"]
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{manifest_path}: unreadable manifest ({type(exc).__name__}: {exc})") from None
        if self.fingerprint and fingerprint != self.fingerprint:
            raise CheckpointError(f"{manifest_path}: from another model (fingerprint {fingerprint!r}, this model "
                                  f"{self.fingerprint!r})")
        data = {}
        for name, entry in sorted(files.items()):
            file = path / name
            if not file.is_file():
                raise CheckpointError(f"{file}: missing (listed in the manifest)")
            blob = file.read_bytes()
            if len(blob) != entry["bytes"]:
                raise CheckpointError(f"{file}: {len(blob)} bytes, the manifest says {entry['bytes']} (truncated "
                                      f"or overwritten)")
            if _sha256(blob) != entry["sha256"]:
                raise CheckpointError(f"{file}: checksum mismatch (the content was altered)")
            data[name] = blob
        return Checkpoint(path, step, dict(manifest.get("meta", {})), data)

    def latest(self, say_fresh: bool = True, job_id: str | None = None,
               load: Callable[[Checkpoint], None] | None = None) -> Checkpoint | None:
        """The newest checkpoint that passes :meth:`verify` (and ``load``). Every one skipped on the way is reported
        in one line; with none valid, says that training starts fresh (if ``say_fresh``) and returns None.

        ``job_id``: only that job's checkpoints are considered (another job's are passed over without a word).
        ``load(ckpt)``: decodes the payload into the model; a :class:`CheckpointError` from it (a payload that
        passed its checksum but does not load) skips the checkpoint like a damaged one, and the next older is tried.
        """
        skipped = 0
        for path in self.candidates():
            if job_id is not None and self.owner(path) != job_id:
                continue
            try:
                ckpt = self.verify(path)
                if load is not None:
                    load(ckpt)
            except CheckpointError as exc:
                skipped += 1
                self.report(f"checkpoint skipped: {exc}")
                continue
            if skipped:
                self.report(f"resuming from the previous valid checkpoint {path} (step {ckpt.step})")
            return ckpt
        if say_fresh:
            why = f"no valid checkpoint ({skipped} skipped)" if skipped else "no checkpoint"
            self.report(f"{why} in {self.directory}; starting fresh")
        return None
