"""Which launcher `hvdsync train` goes to: one question to the launch package (`hvdsync.launch.choose`), asked once.

Nothing here starts a worker: the choice is read as it is, and where the CLI runs, each launcher's `train` is
replaced by one that records what it was handed.
"""
import json
import os
import subprocess
import sys

import pytest

from hvdsync import launch
from hvdsync.config import Config, ConfigError
from hvdsync.launch import base, cli, elastic, local, slurm
from hvdsync.launch import ray as ray_launch
from hvdsync.launch.hosts import Host

NO_STEP: dict = {}                                                           # not inside an srun step
STEP = {"SLURM_STEP_NUM_TASKS": "4", "SLURM_PROCID": "0", "SLURM_MPI_TYPE": "pmix"}


def _cfg(*overrides):
    return Config.load(None, ["tracking.enabled=false", *overrides])


def _ask(argv, environ=NO_STEP):
    """What the CLI's options choose: the config and where, as `hvdsync train` reads them."""
    ns = cli._parser().parse_args(["train", "--no-track", *argv])
    cfg = cli._config(ns)
    return launch.choose(cfg, ray=ns.ray, np_given=cli._np_given(ns, cfg), environ=environ, **cli._where(ns))


@pytest.mark.parametrize("argv, launcher, where", [
    ([], "local", {}),
    (["--hosts", "a:2,b:2", "--np", "4", "--ssh-port", "2222"], "local",
     {"hosts": [Host("a", 2), Host("b", 2)], "ssh_port": 2222}),
    (["--elastic"], "elastic", {}),
    (["--elastic", "--hosts", "a:2,b:2", "--network-interface", "eth0,eth1"], "elastic",
     {"hosts": [Host("a", 2), Host("b", 2)], "network_interfaces": ["eth0", "eth1"]}),
    (["--ray", "auto"], "ray", {"address": "auto"}),
    (["--ray", "10.0.0.1:6379", "--elastic", "--min-np", "1"], "ray", {"address": "10.0.0.1:6379"}),
    # Ray refuses ssh options itself (one line, as before): the choice hands them on.
    (["--ray", "auto", "--ssh-port", "22"], "ray", {"address": "auto", "ssh_port": 22}),
])
def test_the_options_choose_the_launcher_and_where(argv, launcher, where):
    job = _ask(argv)
    assert (job.launcher, job.where, job.starts_workers, job.speaks) == (launcher, where, True, True)
    assert job.module().__name__ == f"hvdsync.launch.{launcher}" and callable(job.module().train)


def test_inside_an_srun_step_each_task_trains_as_its_rank_unless_hosts_or_ray_are_given():
    job = _ask(["--np", "4"], STEP)
    assert (job.launcher, job.where, job.starts_workers, job.speaks) == ("slurm", {"np_given": 4}, False, True)
    assert _ask([], STEP).where == {"np_given": None}                      # no --np: the step's task count
    assert _ask(["--set", "train.np=2"], STEP).where == {"np_given": 2}
    assert _ask([], {**STEP, "SLURM_PROCID": "3"}).speaks is False          # task 0 alone reports errors
    assert _ask([], {**STEP, "SLURM_STEP_NUM_TASKS": "1"}).launcher == "local"   # srun -n1: a launcher of its own
    assert _ask(["--hosts", "a:2"], STEP).launcher == "local"
    assert _ask(["--ray", "auto"], STEP).launcher == "ray"
    with pytest.raises(ConfigError, match=r"^--elastic is not allowed under srun: .*--hosts slurm` in the batch"):
        _ask(["--elastic"], STEP)


def test_choosing_imports_no_launcher_and_not_ray():
    # Ray is optional: its launcher module is imported when a Ray job trains, not when a job is chosen.
    code = ("import sys; from hvdsync import launch; from hvdsync.config import Config; "
            "cfg = Config.load(None, ['elastic.enabled=true']); job = launch.choose(cfg, ray='auto', environ={}); "
            "print(job.launcher, sorted(m for m in sys.modules if m in ('ray', 'hvdsync.launch.ray', "
            "'hvdsync.launch.elastic')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split("\n")[0] == "ray []", out.stderr


class _Result:
    rank = 0
    warnings = ["a store did not answer"]

    def summary(self):
        return "trained"


@pytest.fixture
def launched(monkeypatch):
    """Each launcher's `train` records its name and arguments instead of starting workers."""
    seen = []

    def fake(name):
        return lambda cfg, **kw: seen.append((name, cfg.train.np, kw)) or _Result()

    for module in (local, elastic, ray_launch):
        monkeypatch.setattr(module, "train", fake(module.__name__.rsplit(".", 1)[1]))
    monkeypatch.setattr(slurm, "train_in_step", lambda cfg, np_given: seen.append(("slurm", np_given, {}))
                        or _Result())
    for name in (*STEP, "HVDSYNC_COMMAND_LINE"):  # restored afterwards, whatever the CLI sets
        monkeypatch.delenv(name, raising=False)
    return seen


@pytest.mark.parametrize("argv, call", [
    ([], ("local", 2, {"quiet": True, "log_dir": None})),
    (["--hosts", "a:1,b:1", "--verbose"], ("local", 2, {"quiet": False, "log_dir": None,
                                                         "hosts": [Host("a", 1), Host("b", 1)]})),
    (["--elastic", "--log-dir", "RUN"], ("elastic", 2, {"quiet": True, "log_dir": "RUN"})),
    (["--ray", "auto", "--np", "3"], ("ray", 3, {"quiet": True, "log_dir": None, "address": "auto"})),
])
def test_the_cli_calls_the_chosen_launcher_once(launched, argv, call, capsys):
    assert cli.main(["train", "--no-track", *argv]) == 0
    out = capsys.readouterr()
    assert launched == [call]
    assert out.out == "trained\n" and out.err == "hvdsync: warning: a store did not answer\n"
    assert json.loads(os.environ["HVDSYNC_COMMAND_LINE"]) == ["hvdsync", *sys.argv[1:]]   # for the run's record


def test_the_cli_in_an_srun_step_reports_from_task_0_only(launched, monkeypatch, capsys):
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "2")
    monkeypatch.setenv("SLURM_PROCID", "1")
    monkeypatch.setattr(_Result, "rank", 1)
    assert cli.main(["train", "--no-track", "--np", "2"]) == 0
    assert launched == [("slurm", 2, {})] and capsys.readouterr() == ("", "")   # rank 1 prints nothing
    assert "HVDSYNC_COMMAND_LINE" not in os.environ          # each task records its own command line

    def refuse(cfg, np_given):
        raise ConfigError("np: 3 is not allowed inside this job step")

    monkeypatch.setattr(slurm, "train_in_step", refuse)
    assert cli.main(["train", "--no-track"]) == 2 and capsys.readouterr().err == ""
    monkeypatch.setenv("SLURM_PROCID", "0")
    assert cli.main(["train", "--no-track"]) == 2
    assert capsys.readouterr().err == "hvdsync: error: np: 3 is not allowed inside this job step\n"


def test_ray_missing_is_one_line(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)                 # `import ray` raises ImportError
    monkeypatch.setattr(base, "preflight", lambda cfg: None)  # whatever Horovod this machine has
    for name in STEP:
        monkeypatch.delenv(name, raising=False)
    assert cli.main(["train", "--no-track", "--ray", "auto"]) == 2
    assert capsys.readouterr().err == ("hvdsync: error: ray: Ray is not installed in this environment; install it "
                                       "with pip install 'hvdsync[ray]'\n")
