"""Every notebook's runtime, from the executed copies in build/notebooks (metadata.hvdsync).

    python -m scripts.docs.runtimes              # a plain table
    python -m scripts.docs.runtimes --markdown   # the same as a markdown table, for notebooks/README.md

A copy made from an older version of its notebook is listed as stale, a notebook without one as missing: their
runtimes are not today's notebook's. The total counts fresh copies only.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from scripts.docs.executed import EXECUTED, NOTEBOOKS, Copy, notebooks, status


def rows(folder: Path = NOTEBOOKS, executed_dir: Path = EXECUTED) -> list[Copy]:
    return [status(source, executed_dir) for source in notebooks(folder)]


def table(copies: list[Copy], markdown: bool = False) -> str:
    head = ("notebook", "seconds", "executed (UTC)", "copy")
    body = [(c.stem, f"{c.meta['seconds']:.1f}" if c.meta else "-", c.meta.get("executed_at", "-"), c.state)
            for c in copies]
    fresh = [c.meta["seconds"] for c in copies if c.state == "fresh"]
    body.append(("total (fresh)", f"{sum(fresh):.1f}", f"{len(fresh)} of {len(copies)} fresh", ""))
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "| --- | ---: | --- | --- |"]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in body])
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in [head, *body])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--markdown", action="store_true", help="a markdown table")
    print(table(rows(), parser.parse_args(argv).markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
