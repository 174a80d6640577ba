"""Training across 2 hosts joined by a bandwidth-limited link: every gradient codec at every link rate, in one run.

    sudo python benchmarks/link.py                                   # 100mbit,1gbit,10gbit,none x torch, tensorflow
    sudo python benchmarks/link.py --rates 1gbit,none --frameworks torch --codecs none,fp16,topk:0.01,ddp-fp16
    sudo python benchmarks/link.py --quick                           # a small model, 2 rates: every path in minutes
    sudo python benchmarks/link.py --scaling --rates 1gbit           # 4 workers on 2 hosts vs 2 on 1
    sudo python benchmarks/link.py --repeats 5 --record quiet        # keep it: results/link/<date>-sweep-quiet.*

Over loopback (every other suite here) an all-reduce is a memory copy, so a codec that saves bytes saves little
time. Here the job's 2 workers run on 2 test hosts (:mod:`hvdlab.testhosts`: network namespaces with sshd, joined by
a bridge), and each host's outgoing link is limited to the rate under test with ``tc ... tbf`` (the kernel has no
``netem``: a rate, not a delay). Per rate and framework, one job of 2 Horovod workers (one per host, Gloo over the
link, launched over ssh from node1) trains the wide MLP of ``benchmarks/compression.py`` once per run, from the same
start on the same samples (:func:`hvdsync.launch.train_many`). The runs: every codec (``none``, ``fp16``, ``bf16``,
``int8``, ``topk:0.01`` with error feedback, ``powersgd:2`` and ``powersgd:4``), local SGD averaging every 4 steps
(``local_sgd:4``), and, for PyTorch, DDP over the same link with its own fp32 all-reduce, fp16 and PowerSGD rank-2 and
rank-4 hooks (:mod:`hvdlab.bench.link_ddp`). The task is the synthetic one at ``data.synthetic_spread`` 0.12
(``--spread``), where fp32 reaches ~80 % in the 48 steps, so a codec's cost in accuracy shows. Per run it prints:

* step time: the mean over epochs after the first of the slowest rank's step, and its ratio to ``none`` at the same
  rate; ``sync %``: the share of a step spent waiting for the reduction (encoding, transfer, decoding);
* bytes over the link per step, from node1's interface counters (all it sent during the run / steps), and their
  ratio to what the codec hands Horovod per step times the ring's factor (2 (n-1)/n = 1 on 2 ranks): near 1 when
  the link carries the gradients and little else;
* ``encode ms``: the codec's encode + decode on one step's gradients, timed on both workers at once before training
  (:mod:`hvdlab.bench.link_encode`);
* the cost model's step time (:func:`hvdlab.costmodel.step_time`): the step's compute (its non-sync part,
  measured) + the encoding + the ring of the codec's bytes over the link, whose rate is *measured* at each setting
  by one TCP stream node1 -> node2 (:mod:`hvdlab.bench.link_probe`; also without a limit) + one Horovod call per
  round of collectives (PowerSGD 2 a step, local SGD 1 per H steps), each as long as a grouped all-reduce of a few
  bytes measured on the workers over the same link (:func:`hvdlab.bench.link_encode.call_seconds`); ``pred/meas``;
* test accuracy after the last epoch; then hvdsync's step over DDP's with the matching hook.

So that the comparison cannot favour either side (:mod:`hvdlab.bench.link_fair`): every process on a test host runs on
that host's cores (``TestHosts(split_cpus=True)`` pins what it starts over ssh and what it starts directly: node1's
Horovod worker and DDP's ranks), and before anything is timed every contender's workers report, from inside, their
affinity and intra-op threads: one that differs from the others is refused by name. DDP reads hvdsync's shuffled
plan from the same seed, with the same model, data, lr and batch, and neither side warms PowerSGD up
(:mod:`hvdlab.bench.link_ddp`). At each rate the contenders run interleaved, A B A B, ``--repeats`` times (each
repeat on a seed of its own, the same on both sides); every figure is the median of the repeats with its
[min, max], and accuracy is the mean and standard deviation over all seeds, on 2,560 test samples. A 16 MiB
all-reduce's bus bandwidth over the link, against the link's TCP rate, is ``allreduce_bus_fraction``.

Needs root and Linux network namespaces (``scripts/install_test_hosts.sh`` installs sshd and iproute2).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compression import configs  # noqa: E402 - the same models and codecs as the loopback suite

from hvdlab import costmodel  # noqa: E402
from hvdlab.bench import link_ddp, link_encode, link_fair, link_probe, suite  # noqa: E402
from hvdlab.bench.link_report import (accuracy_summary, aggregate, bad_rates, costmodel_fit, ddp_row,  # noqa: E402
                                      rate_bits, scaling_row, summarise, table, versus_ddp)
from hvdsync.core.train.seeding import threads_per_worker  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RATES = ["100mbit", "1gbit", "10gbit", "none"]
# PowerSGD at rank 4 too: at rank 2 the harder task lost 7.6 accuracy points against fp32 after 48 steps, at rank 4
# 0.8 (benchmarks/results/link/2026-12-02-sweep-torch-1gbit-ranks), for 0.07 MB more per step.
RUNS = ["none", "fp16", "bf16", "int8", "topk:0.01", "powersgd:2", "powersgd:4", "local_sgd:4", *link_ddp.HOOKS]
# The task's class centres (data.synthetic_spread): at compression.py's 1.5 every run reached accuracy 1.0 after 48
# steps, so a codec's cost in accuracy could not show; at 0.12 plain SGD reaches ~80 % in those steps.
SPREAD = 0.12
SUBNET = "10.77.3"  # not the test suite's 10.77.1: a sweep never collides with a test run
# The test set: 2,560 samples, where the standard error of an accuracy near 0.8 (sqrt(p (1 - p) / n)) is 0.8 points,
# below the 1 point a claim is stated in (at the 512 samples of 2,048 x 0.25 it was 1.8); the training set stays
# 1,536 samples, 24 steps of 2 x 32 an epoch.
TEST_SET = {"synthetic_samples": 4096, "test_fraction": 0.625}
MIN_SEEDS = 5          # an accuracy claim rests on at least this many seeds
BUS_BYTES = 16 << 20   # the all-reduce whose bus bandwidth is set against the link's rate
# The all-reduces over the link that the cost model's alpha and beta are fitted to, at every rate and framework: a
# small one (where the fixed costs show) and the bus's (where the bytes do).
FIT_BYTES = (1 << 20, BUS_BYTES)


def build(framework: str, runs: list[str], quick: bool, spread: float = SPREAD) -> list:
    """hvdsync configs for the runs that are not DDP's (``local_sgd:H``: sync.mode local_sgd, period H)."""
    codecs = [r for r in runs if not r.startswith(("ddp", "local_sgd"))]
    data = {"synthetic_spread": spread} if quick else {"synthetic_spread": spread, **TEST_SET}
    out = [c.replace(data=data) for c in configs(framework, codecs, quick)]
    base = out[0]
    for r in runs:
        if r.startswith("local_sgd"):
            out.append(base.replace(sync={"compression": "none", "mode": "local_sgd", "period": int(r.split(":")[1])}))
    return out


def test_samples(cfg) -> int:
    """The size of ``cfg``'s test set (as :mod:`hvdsync.core.train.data` splits it)."""
    return max(1, int(round(cfg.data.synthetic_samples * cfg.data.test_fraction)))


def _where(spec: dict) -> dict:
    # One host: Horovod's driver talks to its local workers over loopback, which hv0 is not.
    one_host = "," not in spec["hosts"]
    return {"hosts": spec["hosts"], "ssh_identity_file": spec["key"], "network_interfaces": None if one_host else ["hv0"]}


def probe(argv: list[str]) -> int:
    """Runs on node1, before anything is timed: hvdsync's workers started as for training report where they run,
    time the codecs' encoding and one Horovod call, and all-reduce a BUS_BYTES tensor over the link; prints
    ``RESULT <json>``."""
    from hvdsync import launch
    from hvdsync.config import Config

    spec = json.loads(argv[0])
    cfg = Config.from_dict(spec["configs"][0])
    data, train = cfg.data, cfg.train
    shapes = link_encode.mlp_shapes(train.framework, data.synthetic_features, train.hidden)
    by_rank = launch.run(link_fair.probe_workers, args=(cfg.to_dict(), spec["encode"], shapes, spec["bus_bytes"],
                                                        FIT_BYTES),
                         np=train.np, sync=cfg.sync, progress=False, **_where(spec))
    # The slowest rank sets the step.
    print("RESULT " + json.dumps({"encode": {c: max(r["encode"][c] for r in by_rank) for c in spec["encode"]},
                                  "call": max(r["call"] for r in by_rank),
                                  "bus_s": max(r["bus_s"] for r in by_rank) if spec["bus_bytes"] else None,
                                  "allreduce_s": {b: max(r["allreduce_s"][b] for r in by_rank)
                                                  for b in by_rank[0]["allreduce_s"]},
                                  "gamma": max(r["gamma"] for r in by_rank),
                                  "placement": [r["placement"] for r in by_rank]}), flush=True)
    return 0


def job(argv: list[str]) -> int:
    """Runs on node1: one job of hvdsync's workers trains every config; prints ``RESULT <json>``: rank 0's results
    and every worker's placement."""
    from hvdsync import launch
    from hvdsync.config import Config
    from hvdsync.launch.base import preflight

    spec = json.loads(argv[0])
    cfgs = [Config.from_dict(c) for c in spec["configs"]]
    for cfg in cfgs:
        preflight(cfg)
    by_rank = launch.run(link_fair.fit_placed, args=([c.to_dict() for c in cfgs],), np=cfgs[0].train.np,
                         sync=cfgs[0].sync, progress=False, **_where(spec))
    print("RESULT " + json.dumps({"results": by_rank[0]["results"], "placement": [r["placement"] for r in by_rank]}),
          flush=True)
    return 0


def ddp(argv: list[str]) -> int:
    """Runs on one test host: one rank of the DDP runs; rank 0 prints ``RESULT <json>``."""
    spec = json.loads(argv[0])
    os.environ["GLOO_SOCKET_IFNAME"] = "hv0"   # the limited link, not loopback
    out = link_ddp.fit(spec["rank"], 2, spec["master"], spec["port"], spec["hooks"], spec["data"], spec["train"],
                       threads_per_worker(1), seed=spec["seed"], probe=spec["probe"])
    if spec["rank"] == 0:
        print("RESULT " + json.dumps(out), flush=True)
    sys.stdout.flush()
    sys.stderr.flush()
    # Both ranks are done (the process group was destroyed after the last run); torch 2.13's Gloo threads have
    # aborted the interpreter's own teardown now and then ("terminate called without an active exception", after
    # rank 0 had reported), which failed a whole sweep for nothing: leave without it.
    os._exit(0)


def _result(out: subprocess.CompletedProcess, what: str):
    line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
    if out.returncode != 0 or line is None:
        raise RuntimeError(f"link.py: {what} failed:\n{out.stderr[-3000:]}")
    return json.loads(line[len("RESULT "):])


def run_ddp(cluster, hooks: list[str], cfg, env: dict, seed: int = 0, probe: bool = False) -> dict:
    """DDP's 2 ranks, one per test host, each started on its host (pinned to its cores as anything run there);
    returns rank 0's ``{"runs": [...], "placement": [...]}``."""
    spec = {"master": cluster.host("node1").address, "port": 29612, "hooks": hooks, "seed": seed, "probe": probe,
            "data": cfg.to_dict()["data"], "train": cfg.to_dict()["train"]}
    peer = cluster.popen("node2", [sys.executable, __file__, "ddp", json.dumps({**spec, "rank": 1})], cwd=ROOT,
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    out = cluster.run("node1", [sys.executable, __file__, "ddp", json.dumps({**spec, "rank": 0})], cwd=ROOT, env=env)
    _, err = peer.communicate(timeout=600)
    if peer.returncode != 0:
        # Rank 0's error first where it failed too: a rank whose peer died only reports the lost connection.
        raise RuntimeError(f"link.py: DDP rank 1 failed (status {peer.returncode}):\n{err[-3000:]}\nrank 0 "
                           f"(status {out.returncode}):\n{out.stderr[-3000:]}")
    return _result(out, "DDP rank 0")


def host_cpus(cluster) -> dict[str, list[int]]:
    """Each test host's cores (the cluster is made with ``split_cpus``)."""
    return {h.name: sorted(c) for h, c in zip(cluster.hosts, cluster.cpus)}


def sweep_point(cluster, k: int, rate: str, bps: float, framework: str, runs: list[str], args, env: dict,
                out: dict) -> None:
    """One rate and framework: the placement of every contender checked, then the contenders timed A B A B ...,
    ``args.repeats`` times, each repeat on its own seed (the same on both sides)."""
    hv = [r for r in runs if not r.startswith("ddp")]
    hooks = [r for r in runs if r.startswith("ddp")] if framework == "torch" else []
    cfgs = build(framework, hv, args.quick, args.spread)
    where = {"hosts": "node1:1,node2:1", "key": str(cluster.key)}
    # The encoding is timed again at every rate: the machine's load, not the rate, moves it.
    bus = BUS_BYTES if rate not in out["allreduce_bus_fraction"] else 0
    pre = _result(cluster.run("node1", [sys.executable, __file__, "probe", json.dumps(
        {**where, "configs": [cfgs[0].to_dict()], "bus_bytes": bus,
         "encode": [c for c in hv if not c.startswith("local_sgd")]})], cwd=ROOT, env=env),
        f"the probe at {rate} ({framework})")
    name = f"hvdsync-{framework}"
    contenders = {name: pre["placement"]}
    if hooks:
        contenders["ddp"] = run_ddp(cluster, hooks, cfgs[0], env, probe=True)["placement"]
    cpus = host_cpus(cluster)
    threads = link_fair.expected_threads(cpus, 1)
    link_fair.check_placement(cpus, threads, contenders)   # refused before anything is timed
    if bus:
        out["allreduce_bus_fraction"][rate] = link_fair.bus_fraction(bus, 2, pre["bus_s"], bps)
        out["allreduce_bus"][rate] = {"bytes": bus, "seconds": pre["bus_s"], "framework": framework,
                                      "link_MBps": bps / 1e6}
    encode, call = pre["encode"], pre["call"]
    out.setdefault("call_ms", {})[f"{rate} {framework}"] = 1e3 * call
    # The cost model's link at this rate, fitted over it: alpha and beta to the all-reduces timed just now, after
    # the measured Horovod call and the measured reduction (gamma) are taken off.
    sizes = sorted(pre["allreduce_s"], key=int)
    fitted = costmodel.fit_link([int(b) for b in sizes], [pre["allreduce_s"][b] for b in sizes], 2,
                                gamma=pre["gamma"], name=f"{rate} {framework}", call=call)
    out.setdefault("link_fit", {})[f"{rate} {framework}"] = {
        "alpha_us": 1e6 * fitted.alpha, "beta_MBps": 1e-6 / fitted.beta if fitted.beta else None,
        "gamma_ps_per_byte": 1e12 * fitted.gamma, "call_ms": 1e3 * call,
        "allreduce_ms": {b: 1e3 * pre["allreduce_s"][b] for b in sizes}}
    timed: dict[str, list[dict]] = {c: [] for c in contenders}
    n_test = test_samples(cfgs[0])
    for repeat, who in link_fair.schedule(list(contenders), args.repeats):
        seed = link_fair.seed_for(k, repeat, args.repeats)
        out["order"].append(f"{rate} {who} {repeat}")
        if who == "ddp":
            got = run_ddp(cluster, hooks, cfgs[0].replace(train={"seed": seed}), env, seed=seed)
            rows = [ddp_row(r, rate) for r in got["runs"]]
        else:
            spec = {**where, "configs": [c.replace(train={"seed": seed}).to_dict() for c in cfgs]}
            got = _result(cluster.run("node1", [sys.executable, __file__, "job", json.dumps(spec)], cwd=ROOT,
                                      env=env), f"the job at {rate} ({framework})")
            rows = [summarise(r, rate, bps, encode.get(r["config"]["sync"]["compression"], 0.0)
                              if r["config"]["sync"]["mode"] == "allreduce" else 0.0, fitted)
                    for r in got["results"]]
        for r in rows:
            r.update(repeat=repeat, seed=seed, test_samples=n_test)
        out["runs"] += rows
        timed[who] += got["placement"]
    link_fair.check_placement(cpus, threads, timed)   # and what the timed workers said
    out["placement"][f"{rate} {framework}"] = {"host_cpus": cpus, "threads": threads, "workers": timed}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="link.py", description=__doc__.split("\n")[0], epilog=suite.RECORD_HELP)
    p.add_argument("--rates", default=",".join(RATES), help="comma-separated tc rates (100mbit, 1gbit) or none")
    p.add_argument("--frameworks", default="torch,tensorflow", help="comma-separated: torch, tensorflow")
    p.add_argument("--codecs", default=",".join(RUNS),
                   help="comma-separated sync.compression values, local_sgd:<H>, ddp, ddp-fp16, ddp-powersgd:<rank>")
    p.add_argument("--repeats", type=int, default=3,
                   help="times each contender is timed at each rate, interleaved with the others (default 3)")
    p.add_argument("--quick", action="store_true", help="the small MLP, 1 epoch, rates 1gbit and none")
    p.add_argument("--scaling", action="store_true", help="instead: 4 workers on 2 hosts vs 2 on 1, codecs none, fp16")
    p.add_argument("--spread", type=float, default=SPREAD,
                   help=f"the synthetic task's data.synthetic_spread (default {SPREAD}; 1.5 is nearly separable)")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON")
    args = p.parse_args(argv)
    rates = [r.strip() for r in ("1gbit,none" if args.quick and args.rates == ",".join(RATES) else args.rates)
             .split(",") if r.strip()]
    frameworks = [f.strip() for f in args.frameworks.split(",") if f.strip()]
    runs = [c.strip() for c in args.codecs.split(",") if c.strip()]
    if "none" not in runs:
        runs.insert(0, "none")
    bad = [f for f in frameworks if f not in ("torch", "tensorflow")] + bad_rates(rates)
    if not args.spread > 0:
        bad.append(f"--spread {args.spread}")
    if args.repeats < 1:
        bad.append(f"--repeats {args.repeats}")
    if bad:
        p.error(f"not allowed: {', '.join(bad)}; frameworks: torch, tensorflow; rates: <number>kbit|mbit|gbit or none; "
                "--spread: a number > 0; --repeats: an integer >= 1")

    from hvdlab.testhosts import TestHosts, unavailable, venv_env

    why = unavailable()
    if why:
        print(f"link.py: {why}", file=sys.stderr)
        return 2
    start, load = time.perf_counter(), os.getloadavg()
    env = venv_env(TF_CPP_MIN_LOG_LEVEL="2")
    out = {"quick": args.quick, "rates": rates, "repeats": args.repeats, "runs": [], "rows": [], "versus_ddp": [],
           "accuracy": [], "scaling": [], "link_MBps": {}, "allreduce_bus_fraction": {}, "allreduce_bus": {},
           "placement": {}, "order": [], "load_average": {"start": load},
           "powersgd_warmup": f"none on either side: hvdsync compresses from its first step; DDP's hook is primed "
                              f"with {link_ddp.PRIMING} passes without an optimizer step (start_powerSGD_iter "
                              f"{link_ddp.START_POWERSGD_ITER}), so its first training step is compressed too"}
    notes: set[str] = set()
    # split_cpus: the 2 hosts are namespaces of one machine; each gets its own half of the cores, as 2 machines would
    # have their own; everything run on a host (over ssh or not) is pinned to them (hvdlab.testhosts).
    with TestHosts(2, prefix=f"hvdlink{os.getpid()}", subnet=SUBNET, split_cpus=True) as cluster:
        for k, rate in enumerate(rates):
            cluster.set_rate(None if rate == "none" else rate)
            bps = link_probe.bytes_per_second(cluster, rate_bits(rate), ROOT)
            out["link_MBps"][rate] = bps / 1e6
            for framework in frameworks:  # one job per framework: a process imports one of them
                if args.scaling:
                    out["scaling"] += scaling(cluster, framework, rate, bps, env, args.quick)
                    continue
                sweep_point(cluster, k, rate, bps, framework, runs, args, env, out)
                if framework != "torch" and any(r.startswith("ddp") for r in runs):
                    notes.add(f"{', '.join(r for r in runs if r.startswith('ddp'))}: PyTorch DDP's communication "
                              f"hooks; {framework} has no such runs")
                print(f"{rate} {framework}: done ({time.perf_counter() - start:.0f} s)", file=sys.stderr, flush=True)
    out["load_average"]["end"] = os.getloadavg()
    report(out, load, start, notes)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


def report(out: dict, load, start: float, notes: set[str]) -> None:
    """Print what the sweep measured; fills ``out``'s ``rows``, ``versus_ddp`` and ``accuracy`` from its runs."""
    print("link rate measured by one TCP stream: " + ", ".join(f"{r} {v:,.0f} MB/s" for r, v in out["link_MBps"].items())
          + f"; load average (1, 5, 15 min) at start {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, at end "
          + " ".join(f"{x:.2f}" for x in out["load_average"]["end"]) + " (the machine is shared: read ratios)")
    for key, p in out["placement"].items():
        print(f"{key}: every worker of " + ", ".join(p["workers"]) + " ran on its host's cores ("
              + "; ".join(f"{h} {','.join(map(str, c))}" for h, c in p["host_cpus"].items())
              + f") with {p['threads']} intra-op thread(s), read inside each worker")
    for rate, f in out["allreduce_bus_fraction"].items():
        b = out["allreduce_bus"][rate]
        print(f"{rate:<8} all-reduce of {b['bytes'] / 2**20:.0f} MiB over the link ({b['framework']}): "
              f"{1e3 * b['seconds']:.1f} ms, bus bandwidth {f:.2f} of the link's TCP rate (target >= 0.9)")
    if out.get("call_ms"):
        print("one Horovod call (a grouped all-reduce of 2 x 4 bytes) over the link, median: "
              + ", ".join(f"{k} {v:.2f} ms" for k, v in out["call_ms"].items()))
    if out["runs"]:
        out["rows"] = aggregate(out["runs"])
        first = out["rows"][0]
        print(f"wide MLP: {first['numel']:,} parameters ({4 * first['numel'] / 1e6:.1f} MB of float32 gradient per "
              f"step), {first['steps']} steps per run, 2 workers on 2 hosts (1 each), Gloo over a tbf-limited veth "
              f"link; each figure the median of {out['repeats']} repeats, contenders interleaved; "
              f"{time.perf_counter() - start:.0f} s in all")
        print(f"PowerSGD warm-up: {out['powersgd_warmup']}")
        print(table(out["rows"]))
        out["versus_ddp"] = versus_ddp(out["runs"])
        for v in out["versus_ddp"]:
            print(f"{v['rate']:<8} hvdsync {v['hvdsync']:<11} / {v['ddp']:<15} step time {v['ratio']:.2f}x "
                  f"[{v['spread'][0]:.2f}, {v['spread'][1]:.2f}] over {v['repeats']} repeats (target <= 1.0), "
                  f"accuracy {v['accuracy_delta']:+.4f}")
        for key, f in out.get("link_fit", {}).items():
            sizes = ", ".join(f"{int(b) / 2**20:g} MiB {ms:.1f} ms" for b, ms in f["allreduce_ms"].items())
            beta = "-" if f["beta_MBps"] is None else f"1 / ({f['beta_MBps']:,.0f} MB/s)"
            print(f"cost model's link fitted at {key}: all-reduces {sizes}; call {f['call_ms']:.2f} ms + "
                  f"alpha {f['alpha_us']:.0f} us per message, beta {beta}, gamma {f['gamma_ps_per_byte']:.0f} ps/byte")
        out["costmodel"] = costmodel_fit(out["rows"])
        for c in out["costmodel"]:
            outside = "; outside: " + ", ".join(f"{o['run']} {o['ratio']:.2f}" for o in c["outside"]) \
                if c["outside"] else ""
            print(f"cost model {c['rate']:<8} {c['framework']:<10} predicted / measured within {c['low']}-{c['high']}"
                  f"x for {c['within']} of {c['configs']} configurations ({c['share']:.0%}; target >= 90%){outside}")
        out["accuracy"] = accuracy_summary(out["runs"])
        for a in out["accuracy"]:
            sd = "-" if a["sd"] is None else f"{a['sd']:.4f}"
            delta = "" if a["delta_vs_none"] is None or a["run"] == "none" else \
                f", vs none {a['delta_vs_none']:+.4f}" + ("" if a["delta_sd"] is None else f" (sd {a['delta_sd']:.4f})")
            claim = "" if a["seeds"] >= MIN_SEEDS else f"; {a['seeds']} seeds: fewer than {MIN_SEEDS}, not a claim"
            print(f"accuracy {a['framework']:<10} {a['run']:<15} {a['mean']:.4f} sd {sd} over {a['seeds']} seeds on "
                  f"{a['test_samples']} test samples (standard error of one run {a['standard_error']:.4f})"
                  f"{delta}{claim}")
    for note in sorted(notes):
        print(note)
    for s in out["scaling"]:
        print(f"{s['rate']:<8} {s['framework']:<10} {s['compression']:<6} 2 on 1 host {s['step2_ms']:.1f} ms, 4 on 2 "
              f"hosts {s['step4_ms']:.1f} ms: efficiency {s['efficiency']:.2f} (cost model's bound {s['bound']:.2f}, "
              f"predicted 4-worker step {s['predicted4_ms']:.1f} ms)")


def scaling(cluster, framework: str, rate: str, bps: float, env: dict, quick: bool) -> list[dict]:
    """4 workers on 2 hosts (2 each) against 2 on node1 alone, same per-worker batch, codecs none and fp16."""
    rows = []
    for np_, hosts in ((2, "node1:2"), (4, "node1:2,node2:2")):
        cfgs = [c.replace(train={"np": np_}) for c in configs(framework, ["none", "fp16"], quick)]
        spec = {"configs": [c.to_dict() for c in cfgs], "hosts": hosts, "key": str(cluster.key), "encode": []}
        got = _result(cluster.run("node1", [sys.executable, __file__, "job", json.dumps(spec)], cwd=ROOT, env=env),
                      f"the scaling job on {hosts} ({framework})")
        rows.append(got["results"])
    return [{"rate": rate, "framework": framework, **scaling_row(two, four, bps)} for two, four in zip(*rows)]


SUITE_PARTS = {"sweep": suite.Part(main, "every codec, local SGD and DDP's hooks at every link rate between 2 test "
                                         "hosts: step time, bytes over the link, the cost model's prediction"),
               "probe": suite.Part(probe, "(internal) placement, encoding and the bus all-reduce, before timing"),
               "job": suite.Part(job, "(internal) the job one sweep point runs on node1"),
               "ddp": suite.Part(ddp, "(internal) one rank of the DDP runs")}

if __name__ == "__main__":
    sys.exit(suite.run(__file__, SUITE_PARTS, default="sweep", doc=__doc__))
