"""Notebook 03's heterogeneous pair: two test hosts (:mod:`hvdlab.testhosts`), one of them behind a slower link.

A cloud cluster is rarely uniform: one node may sit behind a slower NIC or a busier switch port. Here two test hosts,
each on its own share of this machine's cores (``split_cpus``), run one Horovod job through :func:`hvdsync.launch.run`
(its driver on ``node1``, as a launch script on a cluster's login node); :func:`limit_link` puts a token-bucket limit
on ONE host's outgoing link between jobs. :func:`measure` is what each worker runs: the ring all-reduce of a buffer
in float32 and in float16 (half the bytes on the wire), then a short training with ``data.shares: adaptive``, whose
per-epoch shares say whether hvdsync's adaptive shares react to the slow link.

``python -m hvdlab.heterogeneous '<spec JSON>'`` is the driver :func:`run_job` starts on ``node1``; it prints one line
``RESULT <JSON>``.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from hvdlab.testhosts import INTERFACE, TestHosts, _burst, _run, venv_env

ROOT = Path(__file__).resolve().parents[1]


def limit_link(cluster: TestHosts, name: str, rate: str | None) -> None:
    """Limit host ``name``'s outgoing link to ``rate`` (``tc ... tbf``, as :meth:`TestHosts.set_rate` does for every
    host); None takes the limit away. The other hosts keep theirs."""
    ns = cluster.host(name).namespace
    if rate:
        _run(["tc", "-n", ns, "qdisc", "replace", "dev", INTERFACE, "root", "tbf", "rate", rate, "burst",
              _burst(rate), "latency", "100ms"])
    else:
        _run(["tc", "-n", ns, "qdisc", "del", "dev", INTERFACE, "root"], check=False)


def measure(megabytes: float = 4.0, repeats: int = 5, cfg_dict: dict | None = None) -> dict:
    """In every worker: median seconds of the float32 and float16 ring all-reduce of ``megabytes`` (after a
    warm-up, between barriers), then ``hvdsync.torch.fit(cfg_dict)``'s per-epoch history."""
    import horovod.torch as hvd
    import numpy as np
    import torch

    hvd.init()
    torch.set_num_threads(1)
    times = {}
    for dtype in (torch.float32, torch.float16):
        x = torch.ones(int(megabytes * 1e6) // 4, dtype=dtype)   # the same values; float16 is half the bytes
        hvd.allreduce(x, name=f"warm.{dtype}")
        seconds = []
        for i in range(repeats):
            hvd.barrier()
            t0 = time.perf_counter()
            hvd.allreduce(x, name=f"timed.{dtype}.{i}")
            seconds.append(time.perf_counter() - t0)
        times[str(dtype).replace("torch.", "")] = float(np.median(seconds))
    history = None
    if cfg_dict is not None:
        import hvdsync.torch as hs
        from hvdsync.config import Config

        history = hs.fit(Config.from_dict(cfg_dict)).history
    return {"host": os.environ.get("HOROVOD_HOSTNAME"), "rank": hvd.rank(), "allreduce_s": times,
            "history": history}


def _driver(spec: dict) -> dict:
    from hvdsync import launch

    return launch.run(measure, kwargs=spec["kwargs"], np=2, progress=False, hosts=spec["hosts"],
                      ssh_identity_file=spec["key"], ssh_port=spec["ssh_port"], network_interfaces=[INTERFACE])


def run_job(cluster: TestHosts, timeout: float = 300, **kwargs) -> list[dict]:
    """One job of one worker on each of node1 and node2, its driver on node1; returns every rank's :func:`measure`."""
    spec = {"kwargs": kwargs, "hosts": cluster.hosts_arg(1, ["node1", "node2"]), "key": str(cluster.key),
            "ssh_port": cluster.ssh_port}
    out = cluster.run("node1", [sys.executable, "-m", "hvdlab.heterogeneous", json.dumps(spec)], cwd=ROOT,
                      env=venv_env(TF_CPP_MIN_LOG_LEVEL="2"), timeout=timeout)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"the job on the test hosts failed ({out.returncode}): {(out.stderr or out.stdout)[-800:]}")
    return json.loads(lines[-1][len("RESULT "):])


if __name__ == "__main__":
    # numpy scalars and arrays in the history: as plain numbers and lists.
    print("RESULT " + json.dumps(_driver(json.loads(sys.argv[1])), default=lambda o: o.tolist()), flush=True)
