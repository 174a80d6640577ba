"""Host options of `hvdsync train` and `hvdsync.launch.run`: every bad host list is one line before anything starts.

Nothing here starts a worker or opens a connection: each case must stop in the checks (the log folder the launcher
would create first is asserted absent).
"""
import pytest

from hvdsync import launch
from hvdsync.config import ConfigError
from hvdsync.launch import cli, hosts


def _train(args, tmp_path, capsys):
    log_dir = tmp_path / "log"
    code = cli.main(["train", "--no-track", "--log-dir", str(log_dir), *args])
    assert not log_dir.exists()                  # stopped before the launcher made its folder: nothing started
    return code, capsys.readouterr().err


def test_more_processes_than_slots(tmp_path, capsys):
    code, err = _train(["--hosts", "localhost:1", "--np", "2"], tmp_path, capsys)
    assert code == 2 and "np: 2 processes asked but the hosts have 1 slots (localhost:1)" in err, err


def test_a_hostfile_syntax_error_names_the_line(tmp_path, capsys):
    hostfile = tmp_path / "hosts.txt"
    hostfile.write_text("localhost slots=1\nlocalhost slots=two\n")
    code, err = _train(["--hostfile", str(hostfile), "--np", "2"], tmp_path, capsys)
    assert code == 2 and f"{hostfile}, line 2: 'localhost slots=two'" in err, err


def test_slurm_outside_an_allocation_names_the_variable(tmp_path, capsys, monkeypatch):
    for name in ("SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        monkeypatch.delenv(name, raising=False)
    code, err = _train(["--hosts", "slurm"], tmp_path, capsys)
    assert code == 2 and "SLURM_JOB_NODELIST" in err


# Elastic jobs across hosts: hosts whose slots cannot hold the job, or a start Horovod would wait on until its
# elastic timeout, stop in one line before the discovery script is written (hvdsync.launch.elastic.placement).
# The names are never resolved or dialled: each case stops before the checks that would.
@pytest.mark.parametrize("args, message", [
    (["--hosts", "nodea:1,nodeb:1", "--np", "3", "--min-np", "3", "--max-np", "3"],
     "elastic.min_np: 3 workers needed but the hosts have 2 slots (nodea:1,nodeb:1)"),
    (["--hosts", "nodea:2,nodeb:2", "--np", "2", "--min-np", "2", "--max-np", "6"],
     "elastic.max_np: 6 is not allowed with these hosts; they have 4 slots (nodea:2,nodeb:2)"),
    (["--hosts", "localhost:2", "--np", "2", "--max-np", "3"],
     "elastic.max_np: 3 is not allowed with these hosts; they have 2 slots (localhost:2)"),
    (["--hosts", "nodea:4", "--np", "2", "--max-np", "4"],
     "--network-interface: needed for an elastic job that starts on one host (nodea:4)"),
    (["--ssh-port", "2222"], "--network-interface/--ssh-port/--ssh-identity-file: only with --hosts or --hostfile"),
])
def test_elastic_across_hosts_refuses_what_could_not_start(args, message, tmp_path, capsys):
    code, err = _train(["--elastic", *args], tmp_path, capsys)
    assert code == 2 and err.count("\n") == 1 and message in err, err


def test_elastic_with_a_hostfile_counts_its_slots(tmp_path, capsys):
    hostfile = tmp_path / "hosts.txt"
    hostfile.write_text("nodea slots=2\nnodeb slots=1\n")
    code, err = _train(["--elastic", "--hostfile", str(hostfile), "--np", "4", "--min-np", "4", "--max-np", "4"],
                       tmp_path, capsys)
    assert code == 2 and "elastic.min_np: 4 workers needed but the hosts have 3 slots (nodea:2,nodeb:1)" in err, err


def test_a_host_listed_twice(tmp_path, capsys):
    code, err = _train(["--hosts", "localhost:1,localhost:1", "--np", "2"], tmp_path, capsys)
    assert code == 2 and "host 'localhost' at entry 2 is already at entry 1" in err, err


def test_a_multi_host_job_from_a_machine_whose_name_resolves_to_loopback_stops_before_any_ssh(tmp_path):
    # 192.0.2.1 is a documentation address (TEST-NET-1): the check must stop the job before anything dials it, so
    # the test runs only where the check fires (a host name mapped to 127.x, Debian's default) and never connects.
    listed = [hosts.Host("localhost", 1), hosts.Host("192.0.2.1", 1)]
    problem = hosts.loopback_problem(listed)
    if problem is None:
        pytest.skip("this machine's host name does not resolve to loopback")
    with pytest.raises(ConfigError, match="resolves to 127") as err:
        launch.run(print, np=2, hosts=listed, log_dir=tmp_path / "log", progress=False)
    assert "/etc/hosts" in str(err.value)
    assert not (tmp_path / "log").exists()
