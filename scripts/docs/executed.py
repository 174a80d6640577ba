"""Executed copies of the notebooks, for the documentation site.

The notebook test (tests/notebooks/test_notebooks.py) leaves each passed notebook's executed copy in
``build/notebooks/<stem>.ipynb``, tagged in ``metadata.hvdsync`` with the sha256 of the committed notebook it ran,
its runtime and when it ran. A copy whose hash matches the notebook today is *fresh* and is reused; one whose hash
differs is *stale* (the notebook changed since); a notebook without a copy is *missing*. Only stale and missing ones
are executed here (nbclient, kernel python3, cwd notebooks/, as the test does), and written back the same way.

    python -m scripts.docs.executed                     # reuse what is fresh, execute the rest
    python -m scripts.docs.executed --missing fail      # exit 1 naming what is not fresh, execute nothing
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
EXECUTED = ROOT / "build" / "notebooks"
# 12a_..., 12b_... too: a notebook split in two keeps its section's number.
NAME = re.compile(r"^\d\d[a-z]?_[a-z0-9_]+$")
POLICIES = ("execute", "render", "fail")


@dataclass
class Copy:
    """One notebook and what build/notebooks holds for it."""
    stem: str
    source: Path
    executed: Path
    state: str                      # fresh | stale | missing
    meta: dict = field(default_factory=dict)
    action: str = ""                # reused | executed | stale (rendered as it is) | source (rendered without outputs)


def notebooks(folder: Path = NOTEBOOKS) -> list[Path]:
    """Every tutorial notebook in ``folder``, in order (a glob: a new or split notebook needs no edit here)."""
    return sorted(p for p in folder.glob("[0-9][0-9]*.ipynb") if NAME.match(p.stem))


def source_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def status(source: Path, executed_dir: Path = EXECUTED) -> Copy:
    """Whether ``executed_dir`` holds a copy of ``source`` executed from its current bytes."""
    import nbformat

    executed = executed_dir / source.name
    if not executed.is_file():
        return Copy(source.stem, source, executed, "missing")
    meta = dict(nbformat.read(executed, as_version=4).metadata.get("hvdsync", {}))
    state = "fresh" if meta.get("source_sha256") == source_sha256(source) else "stale"
    return Copy(source.stem, source, executed, state, meta)


def execute(source: Path, executed_dir: Path = EXECUTED, timeout: int = 900) -> Copy:
    """Execute ``source`` from top to bottom in its own folder and keep the copy, tagged like the notebook test's."""
    import nbformat
    from nbclient import NotebookClient

    digest = source_sha256(source)          # of the bytes that ran, not of whatever is there when it ends
    nb = nbformat.read(source, as_version=4)
    env_backend = os.environ.pop("MPLBACKEND", None)    # charts must come back as image/png (the inline backend)
    start = time.perf_counter()
    try:
        NotebookClient(nb, timeout=timeout, kernel_name="python3",
                       resources={"metadata": {"path": str(source.parent)}}).execute()
    finally:
        if env_backend is not None:
            os.environ["MPLBACKEND"] = env_backend
    kept = keep(nb, source, time.perf_counter() - start, executed_dir, digest)
    return Copy(source.stem, source, kept, "fresh", dict(nb.metadata["hvdsync"]), "executed")


def keep(nb, source: Path, seconds: float, executed_dir: Path = EXECUTED, digest: str | None = None) -> Path:
    """Write the executed ``nb`` of ``source`` to ``executed_dir``, tagged with the hash of the source it ran
    (``digest``: taken before it ran, where given) and its runtime; the notebook test keeps its copies through this
    too."""
    import nbformat

    nb.metadata["hvdsync"] = {"source_sha256": digest or source_sha256(source), "seconds": round(seconds, 1),
                              "executed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    executed_dir.mkdir(parents=True, exist_ok=True)
    partial = executed_dir / f".{source.stem}.ipynb.partial"
    nbformat.write(nb, partial)
    partial.replace(executed_dir / source.name)   # a reader never sees half a file
    return executed_dir / source.name


def ensure(sources: list[Path], executed_dir: Path = EXECUTED, missing: str = "execute", stale: str = "execute",
           timeout: int = 900, log=None) -> list[Copy]:
    """Reuse every fresh copy; for the others do what ``missing`` / ``stale`` say.

    Args:
        missing: ``execute`` it, ``render`` the committed notebook without outputs (with a note saying so), or
            ``fail`` (raise, naming every notebook concerned).
        stale: ``execute`` it again, ``render`` the old copy with a visible note that it is stale, or ``fail``.
    """
    log = log or functools.partial(print, flush=True)     # flushed: an execution can take minutes
    for name, value in (("missing", missing), ("stale", stale)):
        if value not in POLICIES:
            raise ValueError(f"{name}={value!r}: must be one of {', '.join(POLICIES)}")
    copies = [status(s, executed_dir) for s in sources]
    refused = [c.stem + f" ({c.state})" for c in copies
               if (c.state == "missing" and missing == "fail") or (c.state == "stale" and stale == "fail")]
    if refused:
        raise RuntimeError("no fresh executed copy in build/notebooks for: " + ", ".join(refused)
                           + " (run their notebook tests, or build with --missing/--stale execute)")
    done = []
    for c in copies:
        policy = {"fresh": None, "missing": missing, "stale": stale}[c.state]
        if policy is None:
            c.action = "reused"
        elif policy == "execute":
            log(f"[docs] executing {c.stem} ({c.state}) ...")
            c = execute(c.source, executed_dir, timeout)
        else:
            c.action = "stale" if c.state == "stale" else "source"
        done.append(c)
        when = f", executed {c.meta['executed_at']} in {c.meta['seconds']} s" if c.meta else ""
        log(f"[docs] {c.action:8} {c.stem}{when}")
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--missing", choices=POLICIES, default="execute")
    parser.add_argument("--stale", choices=POLICIES, default="execute")
    parser.add_argument("--timeout", type=int, default=900, help="per cell, seconds")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        copies = ensure(notebooks(), missing=args.missing, stale=args.stale, timeout=args.timeout)
    except RuntimeError as e:
        print(f"[docs] error: {e}", file=sys.stderr)
        return 1
    counts = {a: sum(c.action == a for c in copies) for a in ("reused", "executed", "stale", "source")}
    print(f"[docs] notebooks: {counts} in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
