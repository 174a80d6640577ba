"""The index of the benchmark records: ``benchmarks/results/README.md``, generated from each suite's ``records.json``.

    python benchmarks/index.py                 # write the index
    python benchmarks/index.py --check         # exit 1 if it is not current, a file belongs to no record, or a
                                               # manifest is wrong (what tests/repo/test_benchmark_index.py asserts)
    python benchmarks/index.py add SUITE/NAME --command "..." --shows "..."   # list files written by other means
                                               # (benchmarks/gpu.sh's folder), then write the index

A runner's ``--record TAG`` lists its record and writes the index itself; edit a ``records.json`` by hand only to
correct a record's line, never its files' numbers (:mod:`hvdlab.bench.records` says how records are named).
"""
import argparse
import sys
from pathlib import Path

from hvdlab.bench import records

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = RESULTS.parents[1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 if anything is out of date or wrong")
    p.add_argument("--results", type=Path, default=RESULTS, help="the results folder (default: beside this script)")
    sub = p.add_subparsers(dest="what")
    add = sub.add_parser("add", help="list a record whose files are already written, then write the index")
    add.add_argument("record", metavar="SUITE/NAME", help="e.g. gpu/2026-12-02-bench-h200")
    add.add_argument("--command", required=True, help="the command that produced it")
    add.add_argument("--shows", required=True, help="one line: what it shows")
    args = p.parse_args(argv)
    if args.what == "add":
        suite, _, name = args.record.partition("/")
        if not (args.results / suite / records.MANIFEST).exists():
            p.error(f"{suite!r}: no such suite in {args.results}")
        if not records.files(args.results / suite, name):
            p.error(f"{args.record}: no file {name}.* or folder {name}/ in {args.results / suite}")
        records.add(args.results, suite, name, args.command, args.shows)
    if args.check:
        wrong = records.problems(args.results, ROOT)
        wrong += [f"belongs to no record: {f.relative_to(args.results)}" for f in records.unlisted(args.results)]
        index = args.results / records.INDEX
        if not index.exists() or index.read_text() != records.render(args.results):
            wrong.append(f"{index} is not current: run python benchmarks/index.py")
        print("\n".join(wrong) or "the index is current; every file belongs to a record")
        return 1 if wrong else 0
    print(f"wrote {records.write_index(args.results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
