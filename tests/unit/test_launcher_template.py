"""One launcher template (issue 50): every launcher is a subclass of :class:`hvdsync.launch.base.Launcher`, trains
through its one ``train`` (preflight -> placement -> the job's run -> the start hook, in that order), and the elastic
launchers share one reset bookkeeping. Nothing here starts a worker: the hooks are the launchers' own, with the
start hook replaced where it would hand the job to Horovod or Ray."""
import contextlib
import inspect
import warnings
from pathlib import Path

import pytest

from hvdsync.config import Config, ConfigError
from hvdsync.launch import base, elastic, elastic_job, local, ray, slurm
from hvdsync.launch.base import Launcher, Start, WorkerError

LAUNCHERS = [local.LocalLauncher, elastic.ElasticHosts, ray.RayLauncher, ray.RayElastic, slurm.SlurmStep]


@pytest.mark.parametrize("cls", LAUNCHERS, ids=lambda c: c.__name__)
def test_every_launcher_is_the_template_with_its_one_train(cls):
    assert issubclass(cls, Launcher)
    # The subclasses fill in hooks; none has a train of its own, so all share one signature and one order.
    assert cls.train is Launcher.train
    assert "train" not in vars(cls)
    assert inspect.signature(cls.train) == inspect.signature(Launcher.train)
    assert list(inspect.signature(Launcher.train).parameters) == ["self", "cfg", "quiet", "progress", "log_dir",
                                                                   "callbacks"]
    assert cls.start is not Launcher.start and cls.name


def test_the_elastic_launchers_share_one_reset_bookkeeping():
    assert issubclass(elastic.ElasticHosts, elastic_job.ElasticLauncher)
    assert issubclass(ray.RayElastic, elastic_job.ElasticLauncher)
    assert not issubclass(local.LocalLauncher, elastic_job.ElasticLauncher)
    assert "job" not in vars(elastic.ElasticHosts) and "job" not in vars(ray.RayElastic)


class _Job:
    """Stands for the job's MLflow run: keeps how it was ended."""

    def __init__(self):
        self.ended = []

    def end(self, status, tags=None):
        self.ended.append((status, tags))


class _Recorded(elastic_job.ElasticLauncher):
    """An elastic launcher whose hooks record their order; ``outcome`` is what its start does."""

    name = "recorded"

    def __init__(self, outcome, calls, job):
        super().__init__()
        self.outcome, self.calls, self.run = outcome, calls, job

    def preflight(self, cfg):
        self.calls.append("preflight")

    def placement(self, cfg):
        self.calls.append("placement")
        return ([], {})

    def job_run(self, cfg, continue_run=None):
        self.calls.append(("job_run", continue_run))
        return contextlib.nullcontext(self.run)

    def start(self, cfg, placed, how):
        self.calls.append(("start", how.run_dir is not None and how.run_dir.is_dir(), how.env))
        return self.outcome()

    def result(self, results):
        return results  # what the bookkeeping hands on: rank 0's result only


def _cfg():
    return Config.from_dict({"train": {"np": 2}, "tracking": {"enabled": False},
                             "elastic": {"enabled": True, "min_np": 1, "max_np": 2}})


def test_the_template_runs_its_steps_in_order_and_ends_the_run_with_the_reset_tags(tmp_path):
    calls, job = [], _Job()
    resets = [{"time": 0.0, "reason": "a host left", "size_before": 2, "size_after": 1, "recovery_seconds": 1.5,
               "step": 7}]
    result = {"rank": 0, "world_size": 1, "epochs_trained": 1, "resets": resets}
    launcher = _Recorded(lambda: [{"rank": 1}, result], calls, job)
    launcher.rank0 = lambda results: results[1]
    assert launcher.train(_cfg(), log_dir=tmp_path / "run") == [result]
    assert calls == ["preflight", "placement", ("job_run", None), ("start", False, {})]  # log_dir is not made
    ((status, tags),) = job.ended
    assert status == "FINISHED" and tags["hvdsync.world_sizes"] == "2,1" and tags["hvdsync.resets"] == "1"


def test_a_failed_elastic_job_is_failed_with_its_tags_and_keeps_its_own_folder(monkeypatch, tmp_path):
    made = []
    real = elastic_job.tempfile.mkdtemp
    monkeypatch.setattr(elastic_job.tempfile, "mkdtemp", lambda prefix: made.append(real(prefix=prefix, dir=tmp_path))
                        or made[-1])

    def fail():
        raise WorkerError("worker on node1 failed")

    for keep in (True, False):
        calls, job = [], _Job()
        launcher = _Recorded(fail, calls, job)
        launcher.keep_failed_run_dir = keep
        with pytest.raises(WorkerError):
            launcher.train(_cfg())
        assert calls[-1] == ("start", True, {})       # the temporary run folder existed while the job ran
        assert job.ended == [("FAILED", {"hvdsync.world_sizes": "2", "hvdsync.resets": "0"})]
        assert Path(made[-1]).is_dir() is keep  # elastic keeps it for the error; Ray's goes in any case


def test_callbacks_go_to_elastic_jobs_only():
    plain = Config.from_dict({"train": {"np": 2}, "tracking": {"enabled": False}})
    with pytest.raises(ConfigError, match=r"^callbacks=: taken by elastic jobs"):
        local.LocalLauncher().train(plain, callbacks=[object()])
    assert elastic.ElasticHosts().takes_callbacks(plain)


def test_the_hooks_get_how_the_job_was_asked_for(monkeypatch):
    monkeypatch.setattr(base, "preflight", lambda cfg: None)
    seen = {}

    def start(self, cfg, placed, how):
        seen.update(placed=placed, how=how)
        return [{"loss": 0.5}]

    monkeypatch.setattr(local.LocalLauncher, "start", start)
    monkeypatch.setattr(local.LocalLauncher, "result", lambda self, results: results[0])
    monkeypatch.setattr(local, "host_placement", lambda *args: {"hosts": "localhost:2", "args": args})
    cfg = Config.from_dict({"train": {"np": 2}, "tracking": {"enabled": False}})
    assert local.train(cfg, quiet=False, progress=False, log_dir="L", hosts="localhost:2") == {"loss": 0.5}
    assert seen["placed"]["args"] == ("localhost:2", 2, None, None, None)
    assert seen["how"] == Start(quiet=False, progress=False, log_dir="L")


@pytest.mark.parametrize("old, name, new", [
    ("local", "preflight", "hvdsync.launch.base"), ("local", "job_run", "hvdsync.launch.base"),
    ("local", "environ", "hvdsync.launch.base"), ("local", "QUIET_ENV", "hvdsync.launch.base"),
    ("elastic", "reset_tags", "hvdsync.launch.elastic_job"), ("elastic", "checkpoint_job", "hvdsync.launch.elastic_job"),
    ("elastic", "job_env", "hvdsync.launch.elastic_job"), ("elastic", "resumed_run", "hvdsync.launch.elastic_job"),
])
def test_a_moved_name_still_imports_from_its_old_path_and_warns_naming_the_new_one(old, name, new):
    module = {"local": local, "elastic": elastic}[old]
    with pytest.warns(DeprecationWarning, match=rf"hvdsync\.launch\.{old}\.{name} moved to {new}\.{name}"):
        value = getattr(module, name)
    assert value is getattr(__import__(new, fromlist=[name]), name)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from hvdsync.launch.local import run, train, train_many  # noqa: F401 - the local launcher's own: no warning
    with pytest.raises(AttributeError):
        module.no_such_name  # noqa: B018 - the look-up itself is what is tested
