"""Hierarchical all-reduce against Horovod's flat ring on 2 test hosts x 2 workers: bytes over the link and time.

    sudo python benchmarks/hierarchical.py                          # 100mbit, 1gbit, none; 16 MB; 5 repeats
    sudo python benchmarks/hierarchical.py --rates 1gbit --megabytes 4 --repeats 3
    sudo python benchmarks/hierarchical.py --record quiet           # keep it: results/hierarchical/<date>-*-quiet.*

The guide's point: inside a machine the workers share a fast bus, across machines the network is the bottleneck, so
reduce inside each machine first and send only one buffer per machine across. Horovod does this itself
(``HOROVOD_HIERARCHICAL_ALLREDUCE``) only in its NCCL and MPI paths; on CPUs over Gloo the same idea is written here
with Horovod's process sets (:mod:`hvdlab.bench.hierarchical`): the ranks of a host all-reduce among themselves, the
hosts' leaders all-reduce across the link, each leader broadcasts the result back.

Two test hosts (:mod:`hvdlab.testhosts`: network namespaces with sshd, each on its own half of the cores), each
host's outgoing link limited with ``tc ... tbf``; one Horovod job of 4 workers (node1:2,node2:2, Gloo over the
link). At each rate, in the same job, flat and hierarchical all-reduces of a ``--megabytes`` float32 buffer alternate
(A B A B ...) ``--repeats`` times, ``--rounds`` all-reduces each. Per rate it prints the median seconds per all-reduce
(the slowest rank of each repeat) with [min, max], the bytes each host's link carried each way per all-reduce in
buffers (from the link's own counters; the ring formula says 1.5 flat, 1.0 hierarchical), the link's TCP rate
measured by one stream, and hierarchical over flat. Both sums are checked against a float64 one: a wrong reduction
fails the run.

Needs root and Linux network namespaces (``scripts/install_test_hosts.sh`` installs sshd and iproute2).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from hvdlab.bench import hierarchical, link_probe, suite
from hvdlab.bench.link_report import bad_rates, rate_bits

ROOT = Path(__file__).resolve().parents[1]
RATES = ["100mbit", "1gbit", "none"]
SUBNET = "10.77.5"   # apart from the test suite's 10.77.1 and the link sweep's 10.77.3
HOSTS = ["node1", "node1", "node2", "node2"]   # rank -> host, as Horovod places node1:2,node2:2


def job(argv: list[str]) -> int:
    """Runs on node1: the 4 workers alternate flat and hierarchical all-reduces; prints ``RESULT <json>``."""
    from hvdsync import launch

    spec = json.loads(argv[0])
    by_rank = launch.run(hierarchical.traffic, kwargs=spec["kwargs"], np=len(HOSTS), progress=False,
                         hosts="node1:2,node2:2", ssh_identity_file=spec["key"], network_interfaces=["hv0"])
    print("RESULT " + json.dumps(by_rank), flush=True)
    return 0


def summarise(by_rank: list[dict], rate: str, bps: float) -> dict:
    """One rate's row: per way, the median of the repeats' slowest rank and [min, max], and the leaders' link bytes
    per all-reduce in buffers."""
    row = {"rate": rate, "link_MBps": round(bps / 1e6, 2), "buffer_bytes": by_rank[0]["buffer_bytes"]}
    leaders = [r for r in by_rank if r["leader"]]
    per = by_rank[0]["buffer_bytes"] * by_rank[0]["rounds"]
    for way in ("flat", "hierarchical"):
        slowest = [max(r[way]["seconds"][i] for r in by_rank) for i in range(len(by_rank[0][way]["seconds"]))]
        row[way] = {"seconds": statistics.median(slowest), "spread": [min(slowest), max(slowest)],
                    "repeats": len(slowest),
                    "link_buffers": max(max(r[way]["tx_bytes"], r[way]["rx_bytes"]) / per for r in leaders)}
    row["ratio"] = row["hierarchical"]["seconds"] / row["flat"]["seconds"]
    row["max_err"] = max(r["max_err"] for r in by_rank)
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="hierarchical.py", description=__doc__.split("\n")[0],
                                epilog=suite.RECORD_HELP)
    p.add_argument("--rates", default=",".join(RATES), help="comma-separated tc rates (100mbit, 1gbit) or none")
    p.add_argument("--megabytes", type=float, default=16, help="the all-reduced buffer, MB (default 16)")
    p.add_argument("--rounds", type=int, default=3, help="all-reduces per repeat and way (default 3)")
    p.add_argument("--repeats", type=int, default=5, help="flat and hierarchical alternated this often (default 5)")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON")
    args = p.parse_args(argv)
    rates = [r.strip() for r in args.rates.split(",") if r.strip()]
    sizes = (("megabytes", args.megabytes), ("rounds", args.rounds), ("repeats", args.repeats))
    bad = bad_rates(rates) + [f"--{k} {v}" for k, v in sizes if not v > 0]
    if bad or not rates:
        p.error(f"not allowed: {', '.join(bad) or 'no rate'}; rates: <number>kbit|mbit|gbit or none; --megabytes, "
                "--rounds, --repeats: numbers > 0")

    from hvdlab.testhosts import TestHosts, unavailable, venv_env

    why = unavailable()
    if why:
        print(f"hierarchical.py: {why}", file=sys.stderr)
        return 2
    start, load, env = time.perf_counter(), os.getloadavg(), venv_env()
    kwargs = {"hosts": HOSTS, "megabytes": args.megabytes, "rounds": args.rounds, "repeats": args.repeats}
    rows = []
    with TestHosts(2, prefix=f"hvdhier{os.getpid()}", subnet=SUBNET, split_cpus=True) as cluster:
        for rate in rates:
            cluster.set_rate(None if rate == "none" else rate)
            bps = link_probe.bytes_per_second(cluster, rate_bits(rate), ROOT)
            spec = {"kwargs": kwargs, "key": str(cluster.key)}
            out = cluster.run("node1", [sys.executable, __file__, "job", json.dumps(spec)], cwd=ROOT, env=env)
            line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
            if out.returncode != 0 or line is None:
                print(f"hierarchical.py: the job at {rate} failed:\n{out.stderr[-3000:]}", file=sys.stderr)
                return 1
            rows.append(summarise(json.loads(line[len("RESULT "):]), rate, bps))
            print(f"{rate}: done ({time.perf_counter() - start:.0f} s)", file=sys.stderr, flush=True)
    wrong = [r["rate"] for r in rows if r["max_err"] > 1e-3 * args.megabytes]
    print(f"2 hosts x 2 workers (Gloo over the link, each host on its own cores), a {args.megabytes:g} MB float32 "
          f"all-reduce, flat and hierarchical alternated {args.repeats} times x {args.rounds}; median [min, max] of "
          f"the slowest rank; link buffers: what each host's link carried each way per all-reduce, in buffers")
    print(f"{'rate':>8} | {'link MB/s':>9} | {'flat s':>24} | {'hier. s':>24} | {'hier/flat':>9} | link buffers flat/hier")
    for r in rows:
        f, h = r["flat"], r["hierarchical"]
        print(f"{r['rate']:>8} | {r['link_MBps']:9.1f} | {f['seconds']:.4f} [{f['spread'][0]:.4f}, {f['spread'][1]:.4f}]"
              f" | {h['seconds']:.4f} [{h['spread'][0]:.4f}, {h['spread'][1]:.4f}] | {r['ratio']:9.2f} | "
              f"{f['link_buffers']:.3f} / {h['link_buffers']:.3f}")
    print(f"ring formula: flat {hierarchical.flat_link_buffers(4):.2f}, hierarchical "
          f"{hierarchical.hierarchical_link_buffers(2):.2f} buffers; sums checked against float64 (largest error "
          f"{max(r['max_err'] for r in rows):.1e}); load average {load[0]:.2f} at the start, "
          f"{os.getloadavg()[0]:.2f} at the end; {time.perf_counter() - start:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "args": vars(args) | {"rates": rates},
                                               "load_average": {"start": load, "end": os.getloadavg()}}, indent=2))
    if wrong:
        print(f"hierarchical.py: wrong sums at {', '.join(wrong)}", file=sys.stderr)
        return 1
    return 0


SUITE_PARTS = {"sweep": suite.Part(main, "flat against hierarchical all-reduce on 2 test hosts x 2 workers at each "
                                         "link rate: seconds and bytes over the link"),
               "job": suite.Part(job, "(internal) the job one rate runs on node1")}

if __name__ == "__main__":
    sys.exit(suite.run(__file__, SUITE_PARTS, default="sweep", doc=__doc__))
