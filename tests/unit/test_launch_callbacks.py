"""The elastic launchers take ``callbacks=`` and ship them to every worker; ``record_reads=True`` is their deprecated
spelling of ``callbacks=[SampleLedger()]`` (until 0.3.0).

Nothing here starts a worker: each launcher runs up to the point where it hands the job to Horovod's runner (or to
Ray), which is replaced by one that keeps what it was handed; the worker's side is called in this process with an
adapter that keeps what *it* was handed. Between the two the arguments travel as they do in a real job, through
cloudpickle.
"""
import contextlib
import warnings
from pathlib import Path

import cloudpickle
import pytest

from hvdsync.config import Config, ConfigError
from hvdsync.core.elastic._ledger import SampleLedger
from hvdsync.core.elastic.loop import RUN_DIR_ENV
from hvdsync.core.train.callbacks import Callback
from hvdsync.launch import base
from hvdsync.launch import elastic as elastic_launch
from hvdsync.launch import ray as ray_launch
from hvdsync.launch import worker

DEPRECATED = r"record_reads=True\) is deprecated since hvdsync 0\.2\.0 .*callbacks=\[SampleLedger\(\)\]"


class _Counter(Callback):
    """A user's callback with state of its own: it must reach each worker as a copy, state and all."""

    def __init__(self, label: str):
        self.label, self.steps = label, 0

    def on_step_end(self, ctx):
        self.steps += 1


class _Shipped(Exception):
    """Raised where the launcher hands the job over: nothing after it runs."""


def _cfg(**elastic):
    return Config.from_dict({"train": {"np": 2}, "tracking": {"enabled": False},
                             "elastic": {"enabled": True, "min_np": 1, "max_np": 2, **elastic}})


@pytest.fixture
def shipped_elastic(monkeypatch, tmp_path):
    """Calls ``hvdsync.launch.elastic.train`` and returns what it handed to ``run_elastic`` (fn, args)."""
    seen = {}

    def run_elastic(fn, args, *rest, **kwargs):
        seen.update(fn=fn, args=args)
        raise _Shipped

    monkeypatch.setattr(base, "preflight", lambda cfg: None)   # no Horovod build check here
    monkeypatch.setattr(elastic_launch, "run_elastic", run_elastic)

    def train(cfg, **kwargs):
        with pytest.raises(_Shipped):
            elastic_launch.train(cfg, log_dir=tmp_path / "run", progress=False, **kwargs)
        return seen["fn"], seen["args"]

    return train


@pytest.fixture
def shipped_ray(monkeypatch):
    """Calls ``hvdsync.launch.ray.train`` (no cluster: the connection and its checks replaced) and returns the
    arguments it would ship to ``worker.fit_elastic``."""
    seen = {}

    def run_elastic(fn, args, *rest, **kwargs):
        seen["args"] = args
        raise _Shipped

    monkeypatch.setattr(base, "preflight", lambda cfg: None)
    monkeypatch.setattr(ray_launch, "require_ray", lambda: None)
    monkeypatch.setattr(ray_launch, "resolve_address", lambda address: address)
    monkeypatch.setattr(ray_launch, "connected", lambda ray, address, quiet: contextlib.nullcontext())
    monkeypatch.setattr(ray_launch, "check_capacity", lambda *args, **kwargs: None)
    monkeypatch.setattr(ray_launch, "run_elastic", run_elastic)

    def train(cfg, **kwargs):
        with pytest.raises(_Shipped):
            ray_launch.train(cfg, address="10.0.0.1:6379", progress=False, **kwargs)
        return seen["args"]

    return train


def test_callbacks_ship_as_given_without_a_warning(shipped_elastic):
    cfg, ledger, counter = _cfg(), SampleLedger(), _Counter("mine")
    with warnings.catch_warnings():
        warnings.simplefilter("error")                 # no DeprecationWarning (nor any other) for the new spelling
        fn, args = shipped_elastic(cfg, callbacks=[ledger, counter])
    assert fn is worker.fit_elastic
    cfg_dict, callbacks = args
    assert cfg_dict == cfg.to_dict()
    assert list(callbacks) == [ledger, counter] and callbacks[0] is ledger and callbacks[1] is counter
    # No callbacks: none shipped (the config's train.callbacks are made in the worker, not here).
    assert shipped_elastic(cfg)[1] == (cfg.to_dict(), ())


@pytest.mark.parametrize("launcher", ["elastic", "ray"])
def test_record_reads_warns_at_the_users_line_and_ships_a_ledger(launcher, shipped_elastic, shipped_ray):
    cfg, counter = _cfg(), _Counter("mine")
    with pytest.warns(DeprecationWarning, match=DEPRECATED) as caught:
        if launcher == "elastic":
            _, (cfg_dict, callbacks) = shipped_elastic(cfg, record_reads=True, callbacks=[counter])
        else:
            cfg_dict, callbacks = shipped_ray(cfg, record_reads=True, callbacks=[counter])
    warning = next(w for w in caught if issubclass(w.category, DeprecationWarning))
    # Named after the launcher the user called, worded as fit_elastic's (one helper: hvdsync.fitting.with_ledger).
    assert str(warning.message).startswith(f"hvdsync.launch.{launcher}.train(record_reads=True) is deprecated")
    # stacklevel: the warning points at the line that called the launcher (the fixture's, in this file).
    assert Path(warning.filename).name == Path(__file__).name
    line = Path(__file__).read_text().splitlines()[warning.lineno - 1]
    assert f"{launcher}_launch.train(cfg, " in line, line
    assert cfg_dict == cfg.to_dict()
    assert callbacks[0] is counter and len(callbacks) == 2 and isinstance(callbacks[1], SampleLedger)


def test_record_reads_with_a_ledger_given_adds_no_second_one(shipped_elastic):
    ledger = SampleLedger()
    with pytest.warns(DeprecationWarning, match=DEPRECATED):
        _, (_, callbacks) = shipped_elastic(_cfg(), record_reads=True, callbacks=[ledger])
    assert callbacks == (ledger,)


def test_ray_ships_callbacks_as_given_and_refuses_them_for_a_job_that_is_not_elastic(shipped_ray):
    cfg, ledger = _cfg(), SampleLedger()
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        assert shipped_ray(cfg, callbacks=[ledger]) == (cfg.to_dict(), (ledger,))
    plain = Config.from_dict({"train": {"np": 2}, "tracking": {"enabled": False}})
    with pytest.raises(ConfigError, match=r"callbacks=: taken by elastic jobs .*train\.callbacks"):
        ray_launch.train(plain, callbacks=[ledger])


def test_each_worker_gets_its_own_copy_and_hands_it_to_the_adapter(shipped_elastic, monkeypatch, tmp_path):
    """What a worker does with the shipped arguments: unpickled (as worker.entry does) they are copies, one per
    worker, state and all; worker.fit_elastic hands them to the adapter's fit_elastic as a list."""
    counter = _Counter("mine")
    counter.steps = 3
    fn, args = shipped_elastic(_cfg(), callbacks=[SampleLedger(), counter])
    payload = cloudpickle.dumps((fn, args, {}))        # as hvdsync.launch.local.run and the Ray launcher send it

    handed = []

    class Adapter:
        @staticmethod
        def fit_elastic(cfg, data=None, *, callbacks=()):
            handed.append((cfg, callbacks))

            class Result:
                def to_dict(self):
                    return {"rank": 0}

            return Result()

    monkeypatch.setattr(worker, "adapter", lambda cfg: Adapter)
    monkeypatch.setenv(RUN_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("HOROVOD_RANK", "0")
    for _ in range(2):                                 # two workers, each unpickling the same payload
        fn2, args2, kwargs2 = cloudpickle.loads(payload)
        assert fn2 is worker.fit_elastic
        assert fn2(*args2, **kwargs2) == {"rank": 0}
    (cfg_a, a), (cfg_b, b) = handed
    assert cfg_a == cfg_b == _cfg()
    assert isinstance(a, list) and [type(c) for c in a] == [SampleLedger, _Counter]
    assert a[1].label == "mine" and a[1].steps == 3                       # the state travelled with it
    assert all(x is not y for x, y in zip(a, b)) and a[1] is not counter  # one copy per worker, not the driver's


def test_train_many_ships_callbacks_and_its_deprecated_check_every_step_adds_a_step_spread(monkeypatch):
    from hvdsync.core.telemetry._spread import StepSpread
    from hvdsync.launch import local

    handed = {}

    def fake_run(fn, args=(), **kwargs):
        handed["fn"], handed["args"] = fn, cloudpickle.loads(cloudpickle.dumps(args))
        return [["rank 0's results"]]

    monkeypatch.setattr(local, "run", fake_run)
    cfg = Config.from_dict({"train": {"np": 2}, "tracking": {"enabled": False}})
    counter = _Counter("mine")
    with warnings.catch_warnings():
        warnings.simplefilter("error")                 # callbacks= warns about nothing
        assert local.train_many([cfg], callbacks=[counter]) == ["rank 0's results"]
    assert handed["fn"] is worker.fit_many
    (shipped,) = handed["args"][1]
    assert isinstance(shipped, _Counter) and shipped.label == "mine" and shipped is not counter
    with pytest.warns(DeprecationWarning, match=r"check_every_step=True\) is deprecated .*callbacks=\[StepSpread\(\)\]"):
        local.train_many([cfg], check_every_step=True, callbacks=[counter])
    kinds = [type(c) for c in handed["args"][1]]
    assert kinds == [_Counter, StepSpread]


def test_a_step_spread_reports_the_largest_difference_between_the_ranks_fingerprints():
    import numpy as np

    from hvdsync.core.telemetry._spread import StepSpread
    from hvdsync.core.telemetry.monitor import fingerprint

    class Backend:   # two ranks' all-gathered fingerprints: equal after the first step, apart after the second
        def __init__(self):
            self.rows = iter([[0.0, 0.0], [0.0, 0.5]])

        def parameters(self):
            return [np.ones(3, dtype=np.float32)]

        def allgather(self, values):
            row = next(self.rows)
            return np.stack([np.asarray(values) + row[0], np.asarray(values) + row[1]])

    class Ctx:
        backend = Backend()

    check = StepSpread()
    assert check.report() == {"step_spread_max": None}
    check.on_step_end(Ctx)
    check.on_step_end(Ctx)
    assert check.spreads == [0.0, 0.5] and check.report() == {"step_spread_max": 0.5}
    assert fingerprint([np.ones(3)]).shape == (3,)
