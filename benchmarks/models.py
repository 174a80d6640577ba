"""Real model sizes between 2 test hosts: hvdsync against tuned DDP on ResNet-50 and BERT-base, by the protocol.

    sudo python benchmarks/models.py                                         # both models, 1gbit,10gbit,none, 2 ranks
    sudo python benchmarks/models.py --models resnet50 --rates 1gbit --repeats 10 --record trial
    python benchmarks/models.py --quick                                      # tiny ResNet-50, 2 local ranks, loopback

The models are :mod:`hvdlab.torch.real_models`' ResNet-50 (25.6 M parameters in 161 tensors, 102 MB of fp32
gradient a step) and BERT-base (110 M in 199, 438 MB), at the inputs of :data:`hvdlab.bench.sizing.SIZES`, chosen
so that a step's compute against its gradient's ring time sits where a GPU cluster's does (that module says which
published figures and how far this machine can follow). Per model, rate and codec:

1. the step's compute alone, in one process on node1's core (:func:`hvdlab.bench.models_step.compute_worker`): every
   row's ``compute_to_comm`` is it over the ring time of the gradient at the link's rate (2 (n - 1) / n x bytes /
   rate; at ``none`` the rate one TCP stream measured), with the published GPU figures' beside it;
2. DDP tuned: ``gradient_as_bucket_view=True``, ``static_graph=True``, and ``bucket_cap_mb`` 1, 25 and 100 each
   timed twice (1, 25, 100, 100, 25, 1 in one job); the fastest is used for the comparison and all three are
   reported;
3. hvdsync (its adapter API in a loop of the user's, :func:`~hvdlab.bench.models_step.hvdsync_worker`) and DDP, each
   run a fresh job, in the order of :func:`hvdlab.bench.protocol.schedule` (ABBA within every repeat by default,
   ``--order random`` with ``--seed``), ``--repeats`` times (10 by default). Every step is timed whole on both
   sides, the data fetch included; a step's time is the slowest rank's; every run's per-step times are kept.
   The row: hvdsync's mean step over DDP's over the repeats, with the bootstrap 95 % confidence interval
   (:func:`hvdlab.bench.protocol.ratio_ci`).

Every worker of every contender reads its own affinity and intra-op threads (TensorFlow's too, where it runs); a
contender whose workers do not run on their host's cores with the threads every contender gets is refused by name
before its figures are used (:func:`hvdlab.bench.link_fair.check_placement`). The record's form is
:func:`hvdlab.bench.protocol.problems`'s: a run without it (fewer than 10 repeats, not ``--quick``) says what is
wrong and exits 4, so ``--record`` does not list it; ``--json`` still writes its figures. Ranks run on 2 test hosts
(:mod:`hvdlab.testhosts`, subnet 10.77.6, each host its half of the cores, the link limited with ``tc``); ``--ranks
4`` puts 2 on each. ``--quick`` runs 2 local ranks over loopback (no root): every path, figures that mean nothing.
Needs root and network namespaces otherwise. Keras runs hvdsync's adapter API against MultiWorkerMirroredStrategy
(ring collectives; it has no fp16 on the wire, so an fp16 row sets hvdsync's fp16 against its fp32 and says so:
:mod:`hvdlab.bench.models_step_tf`). Upstream Horovod as a contender is not here yet.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from hvdlab.bench import link_fair, models_step, models_step_tf, protocol, sizing, suite

ROOT = Path(__file__).resolve().parents[1]
SUBNET = "10.77.6"   # its own: no other sweep or test uses it
RATES = ["1gbit", "10gbit", "none"]
BUCKETS_MB = [1, 25, 100]
RATE_BITS = {"1gbit": 1e9, "10gbit": 1e10}
STEPS = {"torch": models_step, "tensorflow": models_step_tf}   # each framework's contenders
PEER = {"torch": "ddp", "tensorflow": "mwms"}


class Local:
    """The ranks on this machine over loopback (``--quick``)."""

    iface, master = "lo", "127.0.0.1"

    def __init__(self, ranks: int) -> None:
        self.ranks = ranks
        self.cpus = {socket.gethostname(): sorted(os.sched_getaffinity(0))}
        self.per_host = ranks

    def host_of(self, rank: int) -> int:
        return 0

    def address(self, rank: int) -> str:
        return "127.0.0.1"

    def run(self, host: int, argv: list[str], env: dict) -> subprocess.CompletedProcess:
        return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)

    def popen(self, host: int, argv: list[str], env: dict, stdout: bool = False) -> subprocess.Popen:
        return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE if stdout else subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)

    def where(self) -> dict:
        return {"hosts": None, "key": None, "ifaces": None}


class Hosts(Local):
    """The ranks on 2 test hosts, ``ranks // 2`` on each, everything pinned to its host's cores."""

    iface = "hv0"

    def __init__(self, cluster, ranks: int) -> None:
        self.cluster, self.ranks, self.per_host = cluster, ranks, ranks // 2
        self.cpus = {h.name: sorted(c) for h, c in zip(cluster.hosts, cluster.cpus)}
        self.master = cluster.host("node1").address

    def host_of(self, rank: int) -> int:
        return rank // self.per_host

    def address(self, rank: int) -> str:
        return self.cluster.host(f"node{self.host_of(rank) + 1}").address

    def run(self, host: int, argv: list[str], env: dict) -> subprocess.CompletedProcess:
        return self.cluster.run(f"node{host + 1}", argv, cwd=ROOT, env=env, timeout=1800)

    def popen(self, host: int, argv: list[str], env: dict, stdout: bool = False) -> subprocess.Popen:
        return self.cluster.popen(f"node{host + 1}", argv, cwd=ROOT, env=env,
                                  stdout=subprocess.PIPE if stdout else subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  text=True)

    def where(self) -> dict:
        return {"hosts": self.cluster.hosts_arg(self.per_host), "key": str(self.cluster.key), "ifaces": ["hv0"]}


# ---- the internal parts (run on a host) -------------------------------------------------------------------------
def job(argv: list[str]) -> int:
    """hvdsync's Horovod job (from node1, or locally); prints ``RESULT <json>``: rank 0's result."""
    from hvdsync import launch
    from hvdsync.config import SyncConfig

    spec = json.loads(argv[0])
    by_rank = launch.run(STEPS[spec["framework"]].hvdsync_worker, args=(spec["work"],), np=spec["ranks"],
                         sync=SyncConfig(compression=spec["work"]["codec"]), progress=False, hosts=spec["hosts"],
                         ssh_identity_file=spec["key"], network_interfaces=spec["ifaces"])
    print("RESULT " + json.dumps(by_rank[0]), flush=True)
    return 0


def ddp(argv: list[str]) -> int:
    """One rank of DDP; rank 0 prints ``RESULT <json>``."""
    spec = json.loads(argv[0])
    os.environ["GLOO_SOCKET_IFNAME"] = spec["iface"]
    out = models_step.ddp_worker(spec["rank"], spec["ranks"], spec["master"], spec["port"], spec["work"],
                                 spec["caps"], spec["threads"])
    if spec["rank"] == 0:
        print("RESULT " + json.dumps(out), flush=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)   # Gloo's threads have aborted torch's interpreter teardown now and then (benchmarks/link.py)


def mwms(argv: list[str]) -> int:
    """One rank of MWMS; every rank prints ``RESULT <json>`` (its own step times)."""
    spec = json.loads(argv[0])
    out = models_step_tf.mwms_worker(spec["rank"], spec["addresses"], spec["work"], spec["threads"])
    print("RESULT " + json.dumps(out), flush=True)
    sys.stdout.flush()
    os._exit(0)   # TensorFlow's gRPC server of the strategy does not stop by itself


def compute(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    print("RESULT " + json.dumps(STEPS[spec["framework"]].compute_worker(spec["work"], spec["threads"])), flush=True)
    return 0


def _result(out: subprocess.CompletedProcess, what: str) -> dict:
    line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
    if out.returncode != 0 or line is None:
        raise RuntimeError(f"models.py: {what} failed (status {out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(line[len("RESULT "):])


# ---- the sweep ------------------------------------------------------------------------------------------------
_port = iter(range(29700, 29999))


def run_ddp(place: Local, work: dict, caps: list[float], threads: int, env: dict) -> dict:
    spec = {"ranks": place.ranks, "master": place.master, "port": next(_port), "iface": place.iface, "work": work,
            "caps": caps, "threads": threads}
    me = [sys.executable, __file__, "ddp"]
    peers = [place.popen(place.host_of(r), me + [json.dumps({**spec, "rank": r})], env) for r in range(1, place.ranks)]
    out = place.run(0, me + [json.dumps({**spec, "rank": 0})], env)
    for r, p in enumerate(peers, 1):
        _, err = p.communicate(timeout=1800)
        if p.returncode != 0:
            raise RuntimeError(f"models.py: DDP rank {r} failed (status {p.returncode}):\n{err[-3000:]}\nrank 0:\n"
                               f"{out.stderr[-3000:]}")
    return _result(out, "DDP rank 0")


def run_mwms(place: Local, work: dict, threads: int, env: dict) -> dict:
    """MWMS' ranks, each on its host; the slowest rank's step times and every rank's placement."""
    addresses = [f"{place.address(r)}:{next(_port)}" for r in range(place.ranks)]
    me = [sys.executable, __file__, "mwms"]
    spec = {"addresses": addresses, "work": work, "threads": threads}
    peers = [place.popen(place.host_of(r), me + [json.dumps({**spec, "rank": r})], env, stdout=True)
             for r in range(1, place.ranks)]
    got = [_result(place.run(0, me + [json.dumps({**spec, "rank": 0})], env), "MWMS rank 0")]
    for r, p in enumerate(peers, 1):
        out, err = p.communicate(timeout=1800)
        got.append(_result(subprocess.CompletedProcess(p.args, p.returncode, out, err), f"MWMS rank {r}"))
    return {"steps_s": [max(ts) for ts in zip(*[g["steps_s"] for g in got])],
            "placement": [w for g in got for w in g["placement"]]}


def run_hvdsync(place: Local, framework: str, work: dict, env: dict) -> dict:
    spec = {"ranks": place.ranks, "framework": framework, "work": work, **place.where()}
    return _result(place.run(0, [sys.executable, __file__, "job", json.dumps(spec)], env), "hvdsync's job")


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def point(place: Local, framework: str, model: str, rate: str, link_bits: float | None, codec: str, args,
          env: dict) -> dict:
    """One framework, model, rate and codec: the compute alone, DDP's bucket sizes (torch), then the protocol's runs
    of hvdsync and the framework's peer (DDP, MWMS); returns the row with its raw runs."""
    sizes = (sizing.QUICK_SIZES if args.quick else sizing.SIZES)[model]
    threads = link_fair.expected_threads(place.cpus, place.per_host)
    peer = PEER[framework]
    work = {"model": model, "codec": codec, "warmup": args.warmup, "steps": args.steps, "seed": args.seed, **sizes}
    alone = _result(place.run(0, [sys.executable, __file__, "compute", json.dumps(
        {"framework": framework, "work": {**work, "steps": max(args.steps, 3)}, "threads": threads})], env),
        "the compute run")
    compute_s = sorted(alone["steps_s"])[len(alone["steps_s"]) // 2]
    grad_bytes = sizing.FP32 * alone["parameters"]
    placements: dict[str, list] = {"hvdsync": [], peer: []}
    tuned: dict = {}
    if peer == "ddp":
        # Each size twice, in ABBA order (1, 25, 100, 100, 25, 1): one pass each picked 1 MB in one trial and
        # 100 MB in the next on this shared machine.
        tuning = run_ddp(place, work, BUCKETS_MB + BUCKETS_MB[::-1], threads, env)
        by_cap = {cap: mean(ts) for cap, ts in tuning["by_cap"].items()}
        best = min(by_cap, key=by_cap.get)
        placements["ddp"] += tuning["placement"]
        tuned = {"ddp_bucket_cap_mb": float(best), "ddp_buckets_s": by_cap,
                 "ddp_settings": {"gradient_as_bucket_view": True, "static_graph": True}}
    else:
        # MWMS has no fp16 on the wire (CommunicationOptions offers none): hvdsync's codec meets its fp32.
        tuned = {"mwms_settings": {"implementation": "RING"}, "contender_codec": "none"}
    runs = []
    sched = protocol.schedule(["hvdsync", peer], args.repeats, args.order, args.seed if args.order == "random" else None)
    for repeat, who in sched:
        w = {**work, "seed": args.seed + repeat}   # the same data on both sides within a repeat
        if who == "hvdsync":
            got = run_hvdsync(place, framework, w, env)
            steps = got["steps_s"]
        elif who == "ddp":
            got = run_ddp(place, w, [tuned["ddp_bucket_cap_mb"]], threads, env)
            steps = next(iter(got["by_cap"].values()))
        else:
            got = run_mwms(place, w, threads, env)
            steps = got["steps_s"]
        placements[who] += got["placement"]
        runs.append({"repeat": repeat, "contender": who, "steps_s": steps, "mean_s": mean(steps)})
        print(f"  {framework} {model} {rate} {codec} repeat {repeat} {who:<8} {1e3 * mean(steps):9.1f} ms a step",
              file=sys.stderr, flush=True)
    link_fair.check_placement(place.cpus, threads, placements)   # refused by name if anything ran elsewhere
    per = {c: [mean([r["mean_s"] for r in runs if r["repeat"] == k and r["contender"] == c])
               for k in range(args.repeats)] for c in ("hvdsync", peer)}
    ratio, ci = protocol.ratio_ci(per["hvdsync"], per[peer])
    return {"model": model, "framework": framework, "ranks": place.ranks, "rate": rate, "codec": codec,
            "contender": peer, "ratio": ratio, "ci": ci, "repeats": args.repeats,
            "compute_to_comm": sizing.compute_to_comm(compute_s, grad_bytes, place.ranks, link_bits),
            "gpu_compute_to_comm": sizing.gpu_compute_to_comm(model, grad_bytes, place.ranks, link_bits)
            if link_bits else None,
            "link_bits_per_second": link_bits, "compute_s": compute_s, "compute_steps_s": alone["steps_s"],
            "gradient_bytes": grad_bytes, "gradient_tensors": alone["tensors"], "input": sizes,
            "hvdsync_s": mean(per["hvdsync"]), "contender_s": mean(per[peer]), "per_repeat_s": per, **tuned,
            "threads": threads, "host_cpus": place.cpus, "placement": placements, "runs": runs}


def report(row: dict) -> str:
    c2c = "-" if row["compute_to_comm"] is None else f"{row['compute_to_comm']:.3f}"
    gpu = "" if not row["gpu_compute_to_comm"] else " (GPU: " + ", ".join(
        f"{k} {v:.3f}" for k, v in row["gpu_compute_to_comm"].items()) + ")"
    peer = ""
    if "ddp_buckets_s" in row:
        buckets = ", ".join(f"{float(k):g} MB {1e3 * v:.1f} ms" for k, v in row["ddp_buckets_s"].items())
        peer = f" (bucket_cap_mb {row['ddp_bucket_cap_mb']:g}; tuning: {buckets})"
    elif row.get("contender_codec") and row["contender_codec"] != row["codec"]:
        peer = f" ({row['contender_codec']} on the wire)"
    return (f"{row['model']} {row['framework']} {row['ranks']} ranks {row['rate']} {row['codec']}: hvdsync "
            f"{1e3 * row['hvdsync_s']:.1f} ms, {row['contender'].upper()} {1e3 * row['contender_s']:.1f} ms{peer}; "
            f"hvdsync / {row['contender'].upper()} {row['ratio']:.3f} [{row['ci'][0]:.3f}, {row['ci'][1]:.3f}] over "
            f"{row['repeats']} repeats; compute alone {1e3 * row['compute_s']:.1f} ms, compute_to_comm {c2c}{gpu}; "
            f"{row['threads']} thread(s) per worker, read inside every worker")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="models.py", description=__doc__.split("\n")[0], epilog=suite.RECORD_HELP)
    p.add_argument("--models", default=",".join(sizing.SIZES), help="comma-separated: resnet50, bert-base")
    p.add_argument("--rates", default=",".join(RATES), help="comma-separated: 1gbit, 10gbit, none")
    p.add_argument("--frameworks", default="torch,tensorflow", help="comma-separated: torch (against DDP), "
                   "tensorflow (against MWMS)")
    p.add_argument("--codecs", default="none,fp16", help=f"comma-separated: {', '.join(models_step.CODECS)}")
    p.add_argument("--ranks", type=int, default=2, help="2 (one per test host) or 4 (two per host)")
    p.add_argument("--repeats", type=int, default=protocol.MIN_REPEATS)
    p.add_argument("--order", default="abba", choices=protocol.ORDERS)
    p.add_argument("--seed", type=int, default=0, help="the data's seed, and a random order's")
    p.add_argument("--steps", type=int, default=10, help="timed steps per run")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first in every run")
    p.add_argument("--quick", action="store_true", help="tiny ResNet-50, 2 repeats, 3 steps, 2 local ranks, loopback")
    p.add_argument("--json", metavar="PATH", help="write the record as JSON")
    args = p.parse_args(argv)
    if args.quick:
        args.repeats, args.steps, args.warmup = min(args.repeats, 2), min(args.steps, 3), 1
        if args.models == ",".join(sizing.SIZES):
            args.models = "resnet50"
        if args.frameworks == "torch,tensorflow":
            args.frameworks = "torch"
        args.rates, args.ranks = "none", 2
    models = [m for m in args.models.split(",") if m]
    rates = [r for r in args.rates.split(",") if r]
    codecs = [c for c in args.codecs.split(",") if c]
    frameworks = [f for f in args.frameworks.split(",") if f]
    bad = ([f"--frameworks {f}" for f in frameworks if f not in STEPS]
           + [f"--models {m}" for m in models if m not in sizing.SIZES] + [f"--rates {r}" for r in rates if r not in RATES]
           + [f"--codecs {c}" for c in codecs if c not in models_step.CODECS]
           + ([f"--ranks {args.ranks}"] if args.ranks not in (2, 4) else [])
           + ([f"--repeats {args.repeats}"] if args.repeats < 1 else [])
           + ([f"--steps {args.steps}"] if args.steps < 1 else []) + ([f"--warmup {args.warmup}"] if args.warmup < 0 else []))
    if bad:
        p.error(f"not allowed: {', '.join(bad)}; models: {', '.join(sizing.SIZES)}; rates: {', '.join(RATES)}; "
                f"codecs: {', '.join(models_step.CODECS)}; ranks: 2 or 4; repeats, steps >= 1; warmup >= 0")
    env = {**os.environ, **link_fair.same_allocator(), "TF_CPP_MIN_LOG_LEVEL": "2",
           "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    start, load = time.perf_counter(), os.getloadavg()
    record = {"quick": args.quick, "protocol": {"order": args.order, "repeats": args.repeats, "seed": args.seed,
                                                "steps": args.steps, "warmup": args.warmup},
              "rows": [], "predictions": [], "link_bits_per_second": {}, "load_average": {"start": load},
              "gpu_reference": {m: [r.__dict__ for r in refs] for m, refs in sizing.GPU_REFERENCE.items()},
              "timed_region": "every step whole on every side: the batch's making (the data fetch), forward, "
                              "backward, the synchronisation and the optimizer's update; hvdsync's adapter API has "
                              "no callbacks of its own"}

    def sweep(place, set_rate, probe):
        for rate in rates:
            set_rate(rate)
            bits = RATE_BITS.get(rate) or probe()
            record["link_bits_per_second"][rate] = bits
            for framework in frameworks:   # a process imports one framework
                for model in models:
                    for codec in codecs:
                        row = point(place, framework, model, rate, bits, codec, args, env)
                        record["rows"].append(row)
                        print(report(row), flush=True)

    if args.quick:
        sweep(Local(args.ranks), lambda rate: None, lambda: None)
    else:
        from hvdlab.bench import link_probe
        from hvdlab.testhosts import TestHosts, unavailable

        why = unavailable()
        if why:
            print(f"models.py: {why}", file=sys.stderr)
            return 2
        with TestHosts(2, prefix=f"hvdmodels{os.getpid()}", subnet=SUBNET, split_cpus=True) as cluster:
            sweep(Hosts(cluster, args.ranks), lambda rate: cluster.set_rate(None if rate == "none" else rate),
                  lambda: 8 * link_probe.bytes_per_second(cluster, None, ROOT))
    record["load_average"]["end"] = os.getloadavg()
    record["seconds"] = time.perf_counter() - start
    print(f"{record['seconds']:.0f} s in all; load average (1, 5, 15 min) at start "
          + " ".join(f"{x:.2f}" for x in load) + ", at end " + " ".join(f"{x:.2f}" for x in record["load_average"]["end"]))
    if args.json:   # kept for a look either way; only a run with the protocol's form exits 0 (and is recorded)
        Path(args.json).write_text(json.dumps(record, indent=1))
    wrong = protocol.problems(record)
    if wrong:
        print("not the protocol's form, so not a record:\n  " + "\n  ".join(wrong), file=sys.stderr)
        return 4
    return 0


SUITE_PARTS = {"sweep": suite.Part(main, "hvdsync against tuned DDP on ResNet-50 and BERT-base between 2 test hosts, "
                                         "by the protocol (ABBA, repeats, bootstrap CI, compute_to_comm)"),
               "job": suite.Part(job, "(internal) hvdsync's Horovod job"),
               "ddp": suite.Part(ddp, "(internal) one rank of DDP"),
               "mwms": suite.Part(mwms, "(internal) one rank of MultiWorkerMirroredStrategy"),
               "compute": suite.Part(compute, "(internal) the step's compute alone, in one process")}

if __name__ == "__main__":
    sys.exit(suite.run(__file__, SUITE_PARTS, default="sweep", doc=__doc__))
