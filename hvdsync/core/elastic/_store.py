"""Where :class:`CheckpointStore` is defined: atomic, checksummed checkpoints in a directory. Its public name is the
adapters' (``hvdsync.torch.CheckpointStore``); hvdsync imports it from here, and :mod:`hvdsync.core.elastic.checkpoint`
forwards it, warning, until 0.4.0. A private module rather than a renamed ``checkpoint``: the format (manifest, checks,
errors) stays in :mod:`~hvdsync.core.elastic.checkpoint`, whose helpers this store writes and reads with.
"""
from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hvdsync.core.elastic.checkpoint import (FORMAT, MANIFEST, PREFIX, Checkpoint, CheckpointError, _fsync_dir, _say,
                                             _sha256, _write_synced, config_fingerprint)


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
