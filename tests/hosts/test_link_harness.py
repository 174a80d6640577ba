"""The link benchmark's contenders on 2 test hosts, each on its own cores (split_cpus), in the smallest
configuration: every worker of hvdsync's job (the one Horovod starts on node1 without ssh included) and both of
DDP's ranks say from inside where they run, and the harness's check accepts them. Nothing is timed or trained."""
import os
import sys
from pathlib import Path

import pytest

from hvdlab.bench import link_fair
from hvdlab.testhosts import TestHosts, unavailable
from tests import benchmark_scripts

ROOT = Path(__file__).resolve().parents[2]


def _link_module():
    return benchmark_scripts.load("link")


@pytest.fixture(scope="module")
def pinned_hosts():
    why = unavailable()
    if why:
        pytest.skip(f"no test hosts: {why}")
    # A subnet of its own: the session's test hosts (10.77.1) and the other suites' never collide with these.
    with TestHosts(2, prefix=f"hvdfair{os.getpid()}", subnet="10.77.34", split_cpus=True) as hosts:
        yield hosts


def test_every_worker_of_every_contender_runs_on_its_host_s_cores(pinned_hosts):
    import json

    link = _link_module()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    cfg = link.build("torch", ["none"], quick=True)[0]
    spec = {"hosts": "node1:1,node2:1", "key": str(pinned_hosts.key), "configs": [cfg.to_dict()],
            "bus_bytes": 1 << 20, "encode": []}
    # The probe hvdsync's contender runs before it is timed: its workers started as for training, a checked
    # all-reduce of 1 MiB over the link, then each worker's placement.
    hv = link._result(pinned_hosts.run("node1", [sys.executable, str(ROOT / "benchmarks" / "link.py"), "probe",
                                                 json.dumps(spec)], cwd=ROOT, env=env, timeout=300), "the probe")
    ddp = link.run_ddp(pinned_hosts, ["ddp"], cfg, env, probe=True)
    cpus = link.host_cpus(pinned_hosts)
    threads = link_fair.expected_threads(cpus, 1)
    for workers in (hv["placement"], ddp["placement"]):
        assert sorted(w["host"] for w in workers) == ["node1", "node2"]
        for w in workers:
            assert w["cpus"] == cpus[w["host"]], w
            assert w["threads"] == threads, w
    assert len({w["pid"] for w in hv["placement"] + ddp["placement"]}) == 4
    link_fair.check_placement(cpus, threads, {"hvdsync-torch": hv["placement"], "ddp": ddp["placement"]})
    assert hv["bus_s"] > 0
    if len(os.sched_getaffinity(0)) >= 2:
        assert not set(cpus["node1"]) & set(cpus["node2"])
        # node1's share is not the whole machine: a worker left unpinned would have failed the check above.
        assert set(cpus["node1"]) != os.sched_getaffinity(0)
