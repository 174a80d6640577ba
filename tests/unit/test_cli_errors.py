"""Bad input to ``hvdsync train``, ``sweep`` and ``runs``: one line on stderr naming what was wrong and what is allowed,
the conventional exit status (2: nothing started), no traceback unless ``--debug``; and the one-line warnings for
what runs but is likely not meant. Every call is in-process and stops before any worker starts; the stores are real
SQLite files and the servers real sockets.
"""
import os
import socket
import sqlite3
import subprocess
import time

import pytest

from hvdsync.config import Config
from hvdsync.launch import cli, hosts, local

NOT_UTF8 = b"train: {lr: 0.1}\n# caf\xe9\n"


@pytest.fixture(autouse=True)
def _environ():
    """``runs`` sets MLflow's HTTP settings in this process's environment: put it back after each call."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def hvdsync(capsys, *argv) -> tuple[int, list[str]]:
    code = cli.main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err.strip().splitlines()


@pytest.fixture
def files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.yaml").write_text("train:\n  lr: [0.1\n")
    (tmp_path / "bad.json").write_text('{"train": {"lr": 0.1}\n')
    (tmp_path / "latin1.yaml").write_bytes(NOT_UTF8)
    (tmp_path / "hosts.txt").write_bytes(b"node0 slots=2\nn\xf6de1 slots=2\n")
    (tmp_path / "afile").write_text("x")
    return tmp_path


# ---- config files, --set, hostfiles: parse and encoding errors --------------------------------------------------
CONFIG_CASES = [
    (["--config", "bad.yaml"], "config file 'bad.yaml', line 3, column 1: while parsing a flow sequence: expected ',' "
     "or ']', but got '<stream end>'; expected a YAML or JSON mapping of sections"),
    (["--config", "bad.json"], "config file 'bad.json', line 2, column 1: while parsing a flow mapping: expected ',' "
     "or '}', but got '<stream end>'; expected a YAML or JSON mapping of sections"),
    (["--set", "train.lr=[0.1"], "--set 'train.lr=[0.1': while parsing a flow sequence: expected ',' or ']', but got "
     "'<stream end>'; expected a YAML value: 4, 0.1, true, fp16, [1, 2], or quoted text"),
    (["--config", "latin1.yaml"], "config file 'latin1.yaml', line 2: byte 0xe9 (at offset 22) is not UTF-8 "
     "(invalid continuation byte); save the file as UTF-8 text"),
    (["--config", "."], "config file: '.' is a folder; give the path of a YAML file"),
    (["--hostfile", "hosts.txt"], "--hostfile: 'hosts.txt', line 2: byte 0xf6 (at offset 15) is not UTF-8 "
     "(invalid start byte); a hostfile is text, one '<host> slots=<N>' per line"),
    (["--set", ".lr=0.1"], "override: '.lr=0.1' is not allowed; expected section.field=value, e.g. "
     "sync.accumulate=4"),
    (["--hosts", ""], "--hosts: entry 1 is empty; expected host:slots entries separated by commas, e.g. a:2,b:2 "
     "(names: letters, digits, '_', '.', '-'; IPv4 addresses, not IPv6)"),
    (["--hosts", "localhost:2", "--ssh-port", "-5"], "--ssh-port: -5 is not allowed; expected a TCP port from 1 to "
     "65535 (sshd's, default 22)"),
    (["--compression", "bf16", "--op", "adasum"], "sync.compression: 'bf16' is not allowed; with sync.op adasum "
     "(Adasum combines whole gradients in Horovod's all-reduce, which only a cast codec hands it) choose one of: "
     "none, fp16; or keep 'bf16' with sync.op average or sum (bf16 is not a cast codec: Horovod cannot all-reduce "
     "bfloat16, so its values travel by allgather and each rank sums them)"),
]


@pytest.mark.parametrize("argv, line", CONFIG_CASES, ids=[" ".join(a) for a, _ in CONFIG_CASES])
def test_train_input_errors_are_one_line_and_exit_2(files, capsys, argv, line):
    assert hvdsync(capsys, "train", "--no-track", *argv) == (2, [f"hvdsync: error: {line}"])


def test_sweep_reads_its_config_the_same_way(files, capsys):
    assert hvdsync(capsys, "sweep", "--config", "latin1.yaml", "--set", "sync.accumulate=1,2") == (
        2, ["hvdsync: error: config file 'latin1.yaml', line 2: byte 0xe9 (at offset 22) is not UTF-8 "
            "(invalid continuation byte); save the file as UTF-8 text"])


def test_a_sweep_axis_given_twice(files, capsys):
    assert hvdsync(capsys, "sweep", "--set", "sync.accumulate=1,4", "--set", "sync.accumulate=2,8") == (
        2, ["hvdsync: error: --set: sync.accumulate is swept twice ('sync.accumulate=1,4' and 'sync.accumulate=2,8'); "
            "give its values once, e.g. --set sync.accumulate=1,2,4"])


def test_debug_shows_the_traceback_and_still_the_line(files, capsys):
    for argv in (["--debug", "train", "--config", "bad.yaml"], ["train", "--config", "bad.yaml", "--debug"]):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("Traceback") and "yaml.parser.ParserError" in err, err
        assert err.strip().splitlines()[-1].startswith("hvdsync: error: config file 'bad.yaml', line 3, column 1")


def test_an_option_given_twice_is_noted(files, capsys):
    code, lines = hvdsync(capsys, "train", "--np", "2", "--np", "3", "--epochs", "0")
    assert (code, lines) == (2, ["hvdsync: warning: --np given 2 times ('2', '3'); the last, '3', is used",
                                 "hvdsync: error: train.epochs: 0 is not allowed; expected an integer >= 1"])


# ---- paths the job writes, checked before any worker starts -----------------------------------------------------
PATH_CASES = [
    (["--no-track", "--log-dir", "afile"], "--log-dir: {tmp}/afile is a file, not a folder; give a folder this user "
     "can write"),
    (["--no-track", "--log-dir", "afile/run"], "--log-dir: {tmp}/afile is a file, where {tmp}/afile/run needs a "
     "folder; give a folder this user can write"),
    (["--no-track", "--elastic", "--min-np", "1", "--max-np", "2", "--checkpoint-dir", "afile"],
     "elastic.checkpoint_dir (--checkpoint-dir): {tmp}/afile is a file, not a folder; give a folder this user can "
     "write"),
    (["--tracking-uri", "sqlite:///afile/mlflow.db"], "tracking.tracking_uri (--tracking-uri): {tmp}/afile is a "
     "file, where {tmp}/afile/mlflow.db needs a folder; give a file this user can write"),
    (["--tracking-uri", "sqlite:///mlflow.db", "--set", "tracking.spool_dir=afile"], "tracking.spool_dir: {tmp}/afile "
     "is a file, not a folder; give a folder this user can write"),
]


@pytest.mark.parametrize("argv, line", PATH_CASES, ids=[" ".join(a) for a, _ in PATH_CASES])
def test_a_file_where_a_folder_is_needed(files, capsys, argv, line):
    assert hvdsync(capsys, "train", *argv) == (2, ["hvdsync: error: " + line.format(tmp=files)])


@pytest.fixture
def read_only(tmp_path):
    """A folder on a read-only bind mount (root ignores permission bits, so a mode would test nothing as root)."""
    folder = tmp_path / "ro"
    folder.mkdir()
    mounted = subprocess.run(["mount", "--bind", str(folder), str(folder)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"a read-only bind mount needs mount privileges here: {mounted.stderr.decode().strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(folder)], check=True, capture_output=True)
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


@pytest.mark.parametrize("option", ["--log-dir", "--checkpoint-dir", "--tracking-uri"])
def test_a_read_only_folder(read_only, capsys, option):
    name = {"--log-dir": "--log-dir", "--checkpoint-dir": "elastic.checkpoint_dir (--checkpoint-dir)",
            "--tracking-uri": "tracking.tracking_uri (--tracking-uri)"}[option]
    value = f"sqlite:///{read_only}/mlflow.db" if option == "--tracking-uri" else read_only / "run"
    kind = "file" if option == "--tracking-uri" else "folder"
    elastic = ["--elastic"] if option == "--checkpoint-dir" else []     # only an elastic job writes checkpoints
    assert hvdsync(capsys, "train", *elastic, option, value, "--set",
                   f"tracking.spool_dir={read_only.parent}/spool") == (
        2, [f"hvdsync: error: {name}: {read_only} cannot be written (Read-only file system); give a {kind} this user "
            f"can write"])


@pytest.mark.skipif(any(n.startswith("nvidia") for n in os.listdir("/dev")), reason="this machine has a GPU")
def test_device_cuda_without_a_gpu(files, capsys):
    assert hvdsync(capsys, "train", "--no-track", "--device", "cuda") == (
        2, ["hvdsync: error: train.device: 'cuda' is not allowed on this machine: it has no NVIDIA GPU (no "
            "/dev/nvidia* device); run on a machine with a GPU, or set train.device=cpu (or auto)"])


# ---- warnings: the job runs, the user hears of it ---------------------------------------------------------------
def test_warnings_before_start(tmp_path, capsys):
    cores = len(os.sched_getaffinity(0))
    cfg = Config.from_dict({"train": {"np": cores + 1}, "data": {"batch_size": 1000}, "tracking": {"enabled": False}})
    cli.before_start(cfg, None, local=True, ssh_port=2222)
    assert capsys.readouterr().err.strip().splitlines() == [
        f"hvdsync: warning: train.np: {cores + 1} workers on {cores} CPU core(s) of this machine: they share cores "
        "(oversubscribed), so each step is slower than with fewer workers",
        "hvdsync: warning: --ssh-port: not used without --hosts or --hostfile; the workers run on this machine, "
        "without ssh",
        f"hvdsync: warning: data.batch_size: 1000 per worker x {cores + 1} workers is more than the 1348 training "
        "samples of 'digits': each epoch is one step of 1348 samples"]
    cli.before_start(Config.from_dict({"train": {"np": 1}, "tracking": {"enabled": False}}), None, local=True)
    assert capsys.readouterr().err == ""


def test_one_host_under_two_names_is_noted(capsys):
    where = local._where("localhost:1,127.0.0.1:1", 2, None, None, None)
    assert where["hosts"] == "localhost:1,127.0.0.1:1"  # still runs: Horovod accepts it
    assert capsys.readouterr().err.strip().splitlines() == [
        "hvdsync: warning: hosts: 'localhost' and '127.0.0.1' are the same machine (this machine); list it once with "
        "all its slots (localhost:N)"]
    assert hosts.same_host_twice([hosts.Host("localhost", 2)]) is None


# ---- hvdsync runs -------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A real store with one run, and two broken copies: not a database, and written by a newer MLflow."""
    import mlflow

    tmp = tmp_path_factory.mktemp("stores")
    client = mlflow.MlflowClient(f"sqlite:///{tmp / 'mlflow.db'}")
    run = client.create_run(client.create_experiment("e"))
    client.set_terminated(run.info.run_id)
    (tmp / "garbage.db").write_bytes(b"not a database " * 100)
    con = sqlite3.connect(tmp / "newer.db")
    sqlite3.connect(tmp / "mlflow.db").backup(con)
    con.execute("UPDATE alembic_version SET version_num = 'ffffffffffff'")
    con.commit()
    con.close()
    return tmp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_runs_store_errors(store, capsys):
    from importlib import metadata

    from hvdsync.core.telemetry.store import _head_revision

    uri = f"sqlite:///{store}/mlflow.db"
    cases = [
        (["list", "--limit", "0"], "--limit: 0 is not allowed; expected an integer >= 1 (the newest runs shown)"),
        (["list", "--limit", "-1"], "--limit: -1 is not allowed; expected an integer >= 1 (the newest runs shown)"),
        (["compare", "nosuchrun", "nosuchrun2", "--tracking-uri", uri],
         f"Run with id=nosuchrun not found in the store {uri}; `hvdsync runs list` shows its run ids"),
        (["reproduce", "nosuchrun", "--tracking-uri", uri],
         f"Run with id=nosuchrun not found in the store {uri}; `hvdsync runs list` shows its run ids"),
        (["list", "--tracking-uri", f"sqlite:///{store}/garbage.db"],
         f"--tracking-uri: {store}/garbage.db is not an MLflow store (file is not a database); give the store's "
         "database file"),
        (["list", "--tracking-uri", f"sqlite:///{store}/newer.db"],
         f"tracking store {store}/newer.db was written by a newer MLflow (schema revision ffffffffffff); the "
         f"installed mlflow {metadata.version('mlflow')} knows up to {_head_revision()}: upgrade it (pip install -U "
         "mlflow) or point tracking.tracking_uri (--tracking-uri) at another store"),
        (["list", "--tracking-uri", f"sqlite:///{store}/typo.db"],
         f"--tracking-uri: no store at {store}/typo.db (the file does not exist or is empty); give the store a job "
         "wrote, e.g. sqlite:///mlflow.db in the folder it ran in"),
        (["compare", "a", "b", "--out", store / "garbage.db" / "c.png", "--tracking-uri", uri],
         f"--out: {store}/garbage.db is a file, where {store}/garbage.db/c.png needs a folder; give a PNG path this "
         "user can write"),
        (["push", str(store / "garbage.db")], f"spool: '{store}/garbage.db' is not a spool file (no record naming its "
         "store); give a .jsonl file of hvdsync's spool folder, or the folder"),
        (["ui", "--port", "99999"], "--port: 99999 is not allowed; expected a TCP port from 1 to 65535 (default 5000)"),
        (["ui", "--port", "0"], "--port: 0 is not allowed; expected a TCP port from 1 to 65535 (default 5000)"),
    ]
    for argv, line in cases:
        assert hvdsync(capsys, "runs", *argv) == (2, [f"hvdsync: error: {line}"]), argv
    assert not (store / "typo.db").exists()
    code, lines = hvdsync(capsys, "runs", "list", "--tracking-uri", uri)
    assert code == 0 and lines == []


def test_runs_servers_that_do_not_answer(capsys):
    port = _free_port()  # nothing listens: refused at once
    assert hvdsync(capsys, "runs", "list", "--tracking-uri", f"http://127.0.0.1:{port}") == (
        2, [f"hvdsync: error: --tracking-uri: the MLflow server http://127.0.0.1:{port} did not answer (connection "
            "refused); start it, or give another store"])
    with socket.socket() as silent:  # takes connections, never answers: MLflow's timeout, set to 5 s for `runs`
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        uri = f"http://127.0.0.1:{silent.getsockname()[1]}"
        start = time.monotonic()
        assert hvdsync(capsys, "runs", "list", "--tracking-uri", uri) == (
            2, [f"hvdsync: error: --tracking-uri: the MLflow server {uri} did not answer (no answer within "
                "MLFLOW_HTTP_REQUEST_TIMEOUT=5 s); start it, or give another store"])
        assert time.monotonic() - start < 30


def test_runs_ui_port_taken(capsys, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert hvdsync(capsys, "runs", "ui", "--port", port, "--tracking-uri", f"sqlite:///{tmp_path}/m.db") == (
            2, [f"hvdsync: error: --port: 127.0.0.1:{port} cannot be used (Address already in use); choose a free "
                f"port, e.g. --port {port + 1}"])


def test_an_unexpected_error_is_one_line_and_debug_shows_it(capsys, monkeypatch):
    def broken(ns):
        raise OSError("disk on fire")

    monkeypatch.setattr(cli, "_doctor", lambda: broken(None))
    assert hvdsync(capsys, "doctor") == (1, ["hvdsync: error: OSError: disk on fire (run with --debug for the "
                                             "traceback)"])
    with pytest.raises(OSError, match="disk on fire"):
        cli.main(["--debug", "doctor"])
