"""Jobs across test hosts, launched the ways users launch them: plain ``horovodrun -H`` with the examples,
``hvdsync train --hostfile``, and :func:`hvdsync.launch.run` from a script on the first host.

Every job is started *on* node1 (the driver must be reachable from the workers, as on a cluster's first node) and
runs ranks on node1 and node2 over their link ``hv0``: ssh launch, Horovod's interface check, Gloo across hosts.
"""
import json
import shlex
import sqlite3
import sys

import numpy as np
import pytest

from hvdsync.core.comm.traffic import ring_link_bytes

PY = sys.executable


def driver(on_host, cluster, spec, timeout=600):
    """Run tests/hosts/jobs_workers.py's driver on node1 with ``spec``; returns its result."""
    if "hosts" in spec:
        spec = {**spec, "ssh_identity_file": str(cluster.key), "network_interfaces": ["hv0"]}
    out = on_host("node1", [PY, "-m", "tests.hosts.jobs_workers", json.dumps(spec)], timeout=timeout)
    line = next((line for line in out.stdout.splitlines() if line.startswith("RESULT ")), None)
    assert out.returncode == 0 and line, out.stdout[-3000:] + out.stderr[-3000:]
    return json.loads(line[len("RESULT "):])


@pytest.fixture(scope="module")
def user_fits(cluster, on_host):
    """The same user job (own MLP, Dataset, DataLoader, hvdsync.torch.fit) on 4 ranks: across node1:2,node2:2,
    and on node1 alone."""
    spec = {"job": "user_fit", "np": 4, "kwargs": {"n": 1000, "epochs": 3}}
    across = driver(on_host, cluster, {**spec, "hosts": "node1:2,node2:2"})
    one = driver(on_host, cluster, spec)
    print(f"\nuser fit on 4 ranks: across 2 hosts {across['seconds']:.1f} s, on one host {one['seconds']:.1f} s")
    return across["result"], one["result"]


def test_ranks_run_on_both_hosts_two_each(user_fits):
    across, one = user_fits
    assert [(r["host"], r["local_rank"]) for r in across] == [("node1", 0), ("node1", 1), ("node2", 0), ("node2", 1)]
    assert {r["host"] for r in one} == {"localhost"}


def test_every_sample_is_read_exactly_once_per_epoch_across_hosts(user_fits):
    across, _ = user_fits
    reads = np.sum([r["reads"] for r in across], axis=0)
    assert reads.tolist() == [3] * 1000                                 # 3 epochs, each sample once per epoch
    assert all(0 < sum(r["reads"]) < 3 * 1000 for r in across)         # and every rank read a share


def test_parameters_are_identical_on_every_rank_and_equal_the_one_host_job(user_fits):
    across, one = user_fits
    params = np.array([r["params"] for r in across])
    assert np.abs(params - params[0]).max() == 0.0                      # identical on the 4 ranks, 2 hosts
    assert all(r["param_spread"] == 0.0 for r in across)
    diff = np.abs(params[0] - np.array(one[1]["params"])).max()
    assert diff < 1e-5                                                  # the tolerance of the one-host tests
    assert across[0]["test_accuracy"] == pytest.approx(one[0]["test_accuracy"], abs=1e-9)
    assert across[0]["test_accuracy"] > 0.8


def test_bytes_over_the_link_match_the_ring_formula(cluster, on_host):
    spec = {"job": "ring_traffic", "np": 4, "hosts": "node1:2,node2:2", "kwargs": {"megabytes": 8, "rounds": 4}}
    ranks = driver(on_host, cluster, spec)["result"]
    assert all(r["sum_ok"] for r in ranks)
    hosts = [r["host"] for r in ranks]
    formula = ring_link_bytes(hosts, ranks[0]["buffer_bytes"])            # 1.5 x 8 MB each way per round
    for r in ranks:
        if r["local_rank"] == 0:
            want = formula[r["host"]] * r["rounds"]
            ratio_tx, ratio_rx = r["tx_bytes"] / want, r["rx_bytes"] / want
            print(f"\n{r['host']}: sent {r['tx_bytes']} B, received {r['rx_bytes']} B over hv0; ring formula "
                  f"{want:.0f} B: x{ratio_tx:.4f} / x{ratio_rx:.4f}")
            # Payload plus TCP/IP headers and Horovod's negotiation; the link counts offloaded segments, so the
            # headers add well under 1 %.
            assert 1.0 <= ratio_tx < 1.05 and 1.0 <= ratio_rx < 1.05


def test_hierarchical_allreduce_sends_only_the_leaders_ring_over_the_link(cluster, on_host):
    # 2 hosts x 2 ranks: the flat ring carries 1.5 buffers each way over each host's link, the hosts' leaders' ring
    # 1.0 (hvdlab.bench.hierarchical); both sums are the same and right.
    from hvdlab.bench import hierarchical

    hosts = ["node1", "node1", "node2", "node2"]
    spec = {"job": "hierarchical", "np": 4, "hosts": "node1:2,node2:2",
            "kwargs": {"hosts": hosts, "megabytes": 8, "rounds": 3}}
    ranks = driver(on_host, cluster, spec)["result"]
    assert [r["hostname"] for r in ranks] == hosts, "ranks are placed host by host"
    assert [r["leader"] for r in ranks] == [True, False, True, False]
    for r in ranks:
        assert r["max_diff"] < 1e-4 and r["max_err"] < 1e-4, r
    for r in (r for r in ranks if r["leader"]):
        buffers = r["buffer_bytes"] * r["rounds"]
        flat = {k: r["flat"][k] / buffers for k in ("tx_bytes", "rx_bytes")}
        tree = {k: r["hierarchical"][k] / buffers for k in ("tx_bytes", "rx_bytes")}
        print(f"\n{r['host']}: buffers over hv0 per all-reduce, sent/received: flat {flat['tx_bytes']:.3f}/"
              f"{flat['rx_bytes']:.3f}, hierarchical {tree['tx_bytes']:.3f}/{tree['rx_bytes']:.3f}")
        for k in flat:
            assert hierarchical.flat_link_buffers(4) <= flat[k] < hierarchical.flat_link_buffers(4) * 1.05
            assert hierarchical.hierarchical_link_buffers(2) <= tree[k] < hierarchical.hierarchical_link_buffers(2) * 1.05


def test_plain_horovodrun_trains_the_torch_example_across_hosts(cluster, on_host):
    out = on_host("node1", ["horovodrun", "-np", "4", "-H", "node1:2,node2:2", "--gloo", "--network-interface", "hv0",
                            "-i", str(cluster.key), "-p", str(cluster.ssh_port),
                            PY, "examples/train_torch.py", "--set", "train.epochs=4", "--set", "tracking.enabled=false"])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "torch x4: test accuracy" in out.stdout and "params equal across ranks: True" in out.stdout, out.stdout
    accuracy = float(out.stdout.split("test accuracy ")[1].split()[0])
    assert accuracy > 0.85


def test_plain_horovodrun_runs_keras_fit_across_hosts(cluster, on_host):
    out = on_host("node1", ["horovodrun", "-np", "2", "-H", "node1:1,node2:1", "--gloo", "--network-interface", "hv0",
                            "-i", str(cluster.key), PY, "examples/keras_fit.py", "--set", "train.epochs=3",
                            "--set", "tracking.enabled=false"])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    line = next(x for x in out.stdout.splitlines() if "keras fit x2: validation accuracy" in x)
    assert float(line.split("validation accuracy ")[1].split()[0]) > 0.8


def test_hvdsync_train_with_a_hostfile_records_hosts_and_ranks_in_mlflow(cluster, on_host, tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# two test hosts\nnode1 slots=1\nnode2 slots=1\n")
    store = tmp_path / "mlflow.db"
    out = on_host("node1", ["hvdsync", "train", "--framework", "tensorflow", "--np", "2", "--epochs", "3",
                            "--hostfile", str(hostfile), *cluster.ssh_args(), "--tracking-uri", f"sqlite:///{store}",
                            "--experiment", "hosts", "--json"])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads(out.stdout[out.stdout.index("{"):])
    assert result["world_size"] == 2 and result["param_spread"] == 0.0 and result["test_accuracy"] > 0.85
    with sqlite3.connect(store) as db:
        params = dict(db.execute("select key, value from params where run_uuid = ?", (result["run_id"],)))
    assert params["hosts"] == "node1:1,node2:1"
    assert params["hosts.count"] == "2" and params["hosts.ranks"] == "node1=0;node2=1"
    assert params["world_size"] == "2"


def _refused(on_host, cluster, *args):
    """An hvdsync train on node1 that must stop before any worker starts: exit status 2, one line."""
    out = on_host("node1", ["hvdsync", "train", "--np", "2", "--no-track", *args], timeout=120)
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    lines = [x for x in out.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, out.stderr
    return lines[0]


def test_bad_hosts_stop_before_any_worker_with_one_line_naming_the_host(cluster, on_host, tmp_path):
    key = ["--ssh-identity-file", str(cluster.key), "--network-interface", "hv0"]
    line = _refused(on_host, cluster, "--hosts", "node1:1,node9:1", *key)
    assert "'node9' does not resolve" in line
    # An address on the test hosts' own subnet where no host answers (never any other address).
    silent = cluster.hosts[0].address.rsplit(".", 1)[0] + ".99"
    line = _refused(on_host, cluster, "--hosts", f"node1:1,{silent}:1", *key)
    assert f"cannot run workers on {silent}" in line and "is up and reachable" in line
    cluster.stop_sshd("node3")
    try:
        line = _refused(on_host, cluster, "--hosts", "node1:1,node3:1", *key)
    finally:
        cluster.restore("node3")
    assert "cannot run workers on node3" in line and "nothing listens for ssh on port 22 of node3" in line
    line = _refused(on_host, cluster, "--hosts", "node1:1,node2:1", "--ssh-identity-file", str(cluster.key),
                    "--network-interface", "eth7")
    assert line.startswith("hvdsync: error: network_interfaces: 'eth7' is missing on this machine, node2")
    assert "every host has: hv0, lo" in line
    stranger = tmp_path / "stranger"
    on_host("node1", ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)])
    line = _refused(on_host, cluster, "--hosts", "node1:1,node2:1", "--ssh-identity-file", str(stranger))
    assert "node2 does not accept this machine's ssh key" in line
    line = _refused(on_host, cluster, "--hosts", "node1:1,node2:1", "--ssh-identity-file", str(tmp_path / "nokey"))
    assert "is not a file" in line


def test_shell_quoting_of_the_remote_command_survives(cluster, on_host):
    # Horovod ssh-es `cd <cwd> ; <command>` to the other hosts: a path or argument with a space must arrive whole.
    out = on_host("node1", ["horovodrun", "-np", "2", "-H", "node1:1,node2:1", "--gloo", "--network-interface", "hv0",
                            "-i", str(cluster.key), PY, "-c",
                            "import sys, os; print('ARG', os.environ['HOROVOD_HOSTNAME'], sys.argv[1:])",
                            "two words"], timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    args = sorted(x.split("ARG ", 1)[1] for x in out.stdout.splitlines() if "ARG " in x)
    assert args == [f"node1 {['two words']}", f"node2 {['two words']}"], shlex.join(args)


def test_plain_elastic_keras_example_grows_onto_a_third_host_and_shrinks_back(cluster, on_host, tmp_path):
    """Horovod's own elastic Keras 3 API (patches 0008-0009) across hosts: examples/plain/horovod_elastic_keras.py
    under ``horovodrun --host-discovery-script``, started on node1 and node2; node3 is discovered after the first
    epoch (its worker joins with the committed state) and taken away once an epoch ended on three hosts (the job goes
    on with two). Every epoch of the eight runs once: the history's epochs are 1..8, with the world sizes the
    discovery said. (It starts on two hosts: Horovod 0.28.1 picks the interfaces once, at the start, and with
    --network-interface and only the launching host discovered it looks for 127.0.0.1 on that interface and stops;
    a host taken away is not taken back, as Horovod counts its stopped worker as failed.)"""
    from tests.parallel.test_horovod_elastic import _discovery, _events, _rewrite_when

    discovery, hosts_file = _discovery(tmp_path, "node1:1\nnode2:1\n")
    history, results = tmp_path / "history.jsonl", tmp_path / "final"
    _rewrite_when(history, hosts_file, '"size": 2,', "node1:1\nnode2:1\nnode3:1\n")
    _rewrite_when(history, hosts_file, '"size": 3,', "node1:1\nnode2:1\n")
    out = on_host("node1", ["horovodrun", "-np", "2", "--min-np", "1", "--max-np", "3", "--host-discovery-script",
                            str(discovery), "--elastic-timeout", "120", "--gloo", "--network-interface", "hv0",
                            "-i", str(cluster.key), "-p", str(cluster.ssh_port), PY,
                            "examples/plain/horovod_elastic_keras.py", "--epochs", "8", "--history", str(history),
                            "--results", str(results)], timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    hist = _events(history)
    assert [h["epoch"] for h in hist] == list(range(1, 9)), hist
    sizes = [h["size"] for h in hist]
    assert sizes[0] == 2 and 3 in sizes and sizes[-1] == 2, sizes        # grew onto node3, then shrank back
    r0, r1 = (json.loads((tmp_path / f"final.rank{r}.json").read_text()) for r in (0, 1))
    assert (r0["size"], r0["epoch"]) == (r1["size"], r1["epoch"]) == (2, 8)
    assert r0["params"] == r1["params"]                                    # one model, bit for bit
    assert r0["loss"] < 0.5 * hist[0]["loss"]
