"""What every runner in ``benchmarks/`` shares: its parts, and ``--record`` (keep the run as a record of its suite).

A runner is one suite (``benchmarks/<suite>.py``); a suite has one part or several (``benchmarks/step.py latency``,
``benchmarks/step.py tf-apply``). Each part is a ``main(argv)`` with its own options; the runner hands it the
command line and adds three options of its own, taken out before the part sees the rest:

    --record TAG    keep this run as ``benchmarks/results/<suite>/<date>[-<part>]-<TAG>``: what it prints (``.txt``)
                    and its figures (``.json``, and ``.md`` where the part writes one), listed in the suite's
                    ``records.json`` and in the index (``benchmarks/results/README.md``), which is regenerated
    --note TEXT     the record's line in the index (default: what the part measures)
    --results DIR   where the suites' folders are (default: ``benchmarks/results`` beside the runner)

    python benchmarks/allreduce.py --record quiet
    python benchmarks/step.py --record quiet latency --steps 150
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from hvdlab.bench import records

RECORD_HELP = ("The runner also takes --record TAG (keep this run as benchmarks/results/<suite>/<date>[-<part>]-<TAG>."
               "{txt,json,...} and list it in the index), --note TEXT (its line there) and --results DIR.")


@dataclass(frozen=True)
class Part:
    """One measurement of a suite.

    Args:
        main: takes the part's command line, returns the exit status (``None``: 0).
        about: one line, what it measures (a record's default line in the index).
        outputs: the options through which ``--record`` asks the part for its files (``--json PATH``, ``--md PATH``),
            besides what it prints.
    """

    main: Callable[[list[str]], int | None]
    about: str
    outputs: tuple[str, ...] = ("json",)


class _Tee(io.TextIOBase):
    """Writes to several streams: the terminal keeps the output while the record gets a copy."""

    def __init__(self, *streams):
        self.streams = streams

    def write(self, text: str) -> int:
        for s in self.streams:
            s.write(text)
        return len(text)

    def flush(self) -> None:
        for s in self.streams:
            s.flush()


def first_line(doc: str | None) -> str:
    """A docstring's first paragraph as one line: what a part measures, for the index."""
    return " ".join((doc or "").strip().split("\n\n")[0].split())


def run(runner: str, parts: dict[str, Part], argv: list[str] | None = None, default: str | None = None,
        doc: str | None = None) -> int:
    """Run the part named first on the command line (``default`` when none is), recording it if asked.

    Args:
        runner: the runner's ``__file__`` (the suite is its name; the results folder is beside it).
        parts: the suite's parts by name; with one part its name never appears on the command line.
        doc: the runner's docstring, printed for ``--help`` when the suite has several parts and none is named.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    own = argparse.ArgumentParser(add_help=False, allow_abbrev=False)  # no abbreviation: --re is not --record
    own.add_argument("--record", metavar="TAG")
    own.add_argument("--note")
    own.add_argument("--results", metavar="DIR")
    opts, rest = own.parse_known_args(argv)
    asked = rest[:1] in (["-h"], ["--help"])
    if len(parts) > 1 and (asked or (not rest and default is None)):  # the suite's help, not one part's
        print((doc or "").strip() + "\n\nparts: " + ", ".join(parts) + "\n" + RECORD_HELP)
        return 0 if asked else 2
    if rest[:1] and rest[0] in parts:
        name = rest.pop(0)
    elif default or len(parts) == 1:
        name = default or next(iter(parts))
    else:
        raise SystemExit(f"{Path(runner).name}: name a part first: {', '.join(parts)} (--help says what each is)")
    part = parts[name]
    if not opts.record:
        return part.main(rest) or 0
    if not records.TAG.match(opts.record):
        raise SystemExit(f"--record {opts.record!r}: lower-case letters, digits and dashes, e.g. quiet or patch0007")
    if any(a == f"--{o}" or a.startswith(f"--{o}=") for a in rest for o in part.outputs):
        raise SystemExit("--record names the part's files itself: leave out " +
                         ", ".join(f"--{o}" for o in part.outputs))
    script = f"benchmarks/{Path(runner).name}"
    suite = Path(runner).stem
    results = Path(opts.results) if opts.results else Path(runner).resolve().parent / "results"
    folder = results / suite
    folder.mkdir(parents=True, exist_ok=True)
    day = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    stem = "-".join([day, *([name] if len(parts) > 1 else []), opts.record])
    # The command as typed, less where the record went and its line: those say nothing about the measurement.
    command = shlex.join(["python", script, *_without(argv, ("--results", "--note"))])
    # Relative to where the run started: the part prints and stores these paths, and a record names no machine's.
    extra = [x for o in part.outputs for x in (f"--{o}", os.path.relpath(folder / f"{stem}.{o}"))]
    done = False
    try:
        with open(folder / f"{stem}.txt", "w") as log, contextlib.redirect_stdout(_Tee(sys.stdout, log)):
            status = part.main(rest + extra) or 0
        done = status == 0
    finally:
        if not done:  # its files stay for a look, unlisted: the index test then asks for them to go or be listed
            print(f"not recorded: {folder / stem}.* is not listed in the index", file=sys.stderr)
    if not done:
        return status
    records.add(results, suite, stem, command, opts.note or part.about, runner=script, about=first_line(doc))
    index = records.write_index(results)
    print(f"recorded {os.path.relpath(folder / stem)}.* and listed it in {os.path.relpath(index)}")
    return 0


def _without(argv: list[str], options: tuple[str, ...]) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in options:
            skip = True
        elif not any(a.startswith(o + "=") for o in options):
            out.append(a)
    return out
