"""The shared loop and the plan cursor in one process: a real numpy backend (softmax regression trained by SGD), no
Horovod, so the loop's own promises (steps in, callbacks, plan position, resume) are checked on their own."""
import json

import numpy as np
import pytest

from hvdsync.config import Config
from hvdsync.core.comm.codecs import WireCounter
from hvdsync.core.train.data import digits
from hvdsync.core.train.loader import PlanCursor, PlanLoader
from hvdsync.core.elastic._ledger import SampleLedger
from hvdsync.core.train.callbacks import Callback
from hvdsync.core.train.loop import array_evaluator
from hvdsync.fitting import fit_loop, loop_settings, plan_for
from hvdsync.core.telemetry.profiling import PhaseTimer
from hvdsync.core.telemetry.progress import PROGRESS_ENV
from hvdsync.core.train._plan import PlanState, ShardPlan
from hvdsync.core.train.shares import split_counts


class NumpyBackend:
    """Softmax regression; ``train_step`` follows the Backend contract (summed loss x scale, one update)."""

    framework, rank, size = "numpy", 0, 1

    def __init__(self, n_features, n_classes, lr=0.5):
        self.w = np.zeros((n_features, n_classes))
        self.lr, self.wire, self.timer = lr, WireCounter(), PhaseTimer()

    grad_tensors = 1

    def train_step(self, micro, scale):
        grad, total = np.zeros_like(self.w), 0.0
        for x, y in micro:
            logits = x @ self.w
            p = np.exp(logits - logits.max(1, keepdims=True))
            p /= p.sum(1, keepdims=True)
            total += float(-np.log(p[np.arange(len(y)), y]).sum())
            p[np.arange(len(y)), y] -= 1
            grad += scale * x.T @ p
        self.w -= self.lr * grad
        return total

    def count_correct(self, x, y):
        return int(((x @ self.w).argmax(1) == y).sum())

    def allgather(self, values):
        return np.asarray(values, dtype=np.float64)[None]

    def parameters(self):
        return [self.w]


class Recorder(Callback):
    def __init__(self, stop_at=None):
        self.events, self.positions, self.stop_at = [], [], stop_at

    def on_train_begin(self, ctx): self.events.append("train_begin")  # noqa: E704
    def on_epoch_begin(self, ctx): self.events.append(f"epoch_begin {ctx.epoch}")  # noqa: E704
    def on_epoch_end(self, ctx): self.events.append(f"epoch_end {ctx.epoch} {sorted(ctx.metrics)[0]}")  # noqa: E704
    def on_train_end(self, ctx): self.events.append(f"train_end {ctx.status}")  # noqa: E704

    def on_step_end(self, ctx):
        self.positions.append((ctx.epoch, ctx.step, ctx.position, ctx.plan_state.to_dict()))
        if self.stop_at is not None and (ctx.epoch, ctx.step) == self.stop_at:
            ctx.stop_training = True


@pytest.fixture(scope="module")
def data():
    return digits(seed=0)


def _cfg(epochs=2):
    return Config.from_dict({"data": {"batch_size": 100}, "train": {"epochs": epochs, "np": 1},
                             "tracking": {"enabled": False}})


def test_loop_runs_callbacks_in_order_and_tracks_the_plan_position(data):
    cfg, rec = _cfg(), Recorder()
    result = fit_loop(cfg, NumpyBackend(64, 10), data, callbacks=[rec])
    steps = -(-len(data.x_train) // 100)
    assert rec.events == ["train_begin", "epoch_begin 0", "epoch_end 0 epoch_seconds", "epoch_begin 1",
                          "epoch_end 1 epoch_seconds", "train_end FINISHED"]
    assert [p[2] for p in rec.positions[:steps]] == [min(100 * (i + 1), len(data.x_train)) for i in range(steps)]
    assert rec.positions[steps - 1][3] == {"epoch": 1, "consumed": 0}     # the end of an epoch rolls over
    assert result.optimizer_steps == 2 * steps and result.test_accuracy > 0.85
    assert result.plan_state == {"epoch": 2, "consumed": 0}


def test_stopping_and_resuming_equals_one_uninterrupted_run(data):
    cfg = _cfg()
    whole = NumpyBackend(64, 10)
    fit_loop(cfg, whole, data)
    first, rec = NumpyBackend(64, 10), Recorder(stop_at=(0, 5))
    stopped = fit_loop(cfg, first, data, callbacks=[rec])
    assert stopped.plan_state == {"epoch": 0, "consumed": 500}
    fit_loop(cfg, first, data, resume=PlanState.from_dict(stopped.plan_state))
    assert np.abs(first.w - whole.w).max() < 1e-12


def test_the_last_progress_line_says_the_logged_train_loss(data, monkeypatch, capsys, tmp_path):
    """The bar showed rank 0's last step's loss; the run logs the epoch's mean (``result.history`` is the dict the
    loop hands the tracker). Both the worker's own plain lines and the launcher's records end on the logged one."""
    monkeypatch.delenv(PROGRESS_ENV, raising=False)       # no launcher: rank 0 prints plain lines (no terminal)
    result = fit_loop(_cfg(), NumpyBackend(64, 10), data)
    logged = result.history[-1]["train_loss"]
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("numpy x1: ") and last.endswith(f"train_loss={logged:.4g}")
    records = tmp_path / "progress.jsonl"                 # a launcher: the records it draws its bar from
    monkeypatch.setenv(PROGRESS_ENV, str(records))
    result = fit_loop(_cfg(), NumpyBackend(64, 10), data)
    lines = [json.loads(line) for line in records.read_text().splitlines()]
    assert lines[-1] == {"n": 0, "train_loss": round(result.history[-1]["train_loss"], 5)}
    step_losses = [r["loss"] for r in lines if "loss" in r]
    assert abs(step_losses[-1] - lines[-1]["train_loss"]) > 1e-3    # what the bar's last figure said before


def test_evaluation_is_a_function_the_user_passes(data):
    cfg = _cfg(epochs=1)
    backend = NumpyBackend(64, 10)
    steps = PlanLoader(data.x_train, data.y_train, plan_for(cfg, len(data.x_train), 1), 0)
    result = fit_loop(cfg, backend, steps, evaluate=lambda: {"hits": (3.0, 4.0), "mean": 0.25})
    assert result.history[0]["hits"] == 0.75 and result.history[0]["mean"] == 0.25
    assert np.isnan(result.test_accuracy)                                 # no test_accuracy: none is claimed


def test_a_plan_for_another_world_is_refused(data):
    cfg = _cfg(epochs=1)
    steps = PlanLoader(data.x_train, data.y_train, ShardPlan(len(data.x_train), 2, 50), 1)
    with pytest.raises(ValueError, match="steps: a plan for 2 ranks is not allowed in a world of 1"):
        fit_loop(cfg, NumpyBackend(64, 10), steps)


@pytest.mark.parametrize("new_world", [1, 2, 3, 5])
def test_cursor_state_resumes_with_exactly_the_unread_samples_at_any_world_size(new_world):
    plan = ShardPlan(103, 2, 8, accumulate=3, seed=4)
    cursors = [PlanCursor(plan, r) for r in range(2)]
    read = []
    for c in cursors:
        c.set_epoch(1)
        for i, (micro, _) in enumerate(c.group(iter(c.micro_batches()))):
            read += [j for m in micro for j in m]
            if i == 3:                                                    # stop inside the epoch, after 4 steps
                break
    state = cursors[0].state_dict()
    assert state == cursors[1].state_dict() == {"epoch": 1, "consumed": 4 * 16}
    assert len(read) == len(set(read)) == 4 * 16
    rest = []
    for r in range(new_world):
        c = PlanCursor(plan.resized(new_world), r)
        c.load_state_dict(state)
        c.set_epoch(1)                                                    # the same epoch: the loaded position stays
        rest += [j for micro, _ in c.group(iter(c.micro_batches())) for m in micro for j in m]
    assert sorted(read + rest) == list(range(103))


def test_cursor_refuses_a_rank_outside_the_world():
    with pytest.raises(ValueError, match=r"rank: 2 is not allowed; expected 0 <= rank < 2 \(the world has 2 ranks\)"):
        PlanCursor(ShardPlan(10, 2, 2), 2)


# ---- the elastic loop is this loop with the elastic callback ------------------------------------------------------
class _Weights:
    """The elastic state's adapter side for the numpy backend: its weights saved and restored by value."""

    fingerprint = "numpy"

    def __init__(self, backend):
        self.backend = backend
        self.save()

    def save(self):
        self.saved = self.backend.w.copy()

    def restore(self):
        self.backend.w = self.saved.copy()

    def sync(self):
        pass


def test_the_elastic_loop_trains_as_the_shared_loop_and_resumes_from_a_commit(data):
    from hvdsync.elastic import ElasticState
    from hvdsync.core.elastic.loop import elastic_fit

    class Elastic(NumpyBackend):
        def refresh(self):
            pass

    plain = NumpyBackend(64, 10)
    expected = fit_loop(_cfg(), plain, data)
    whole = Elastic(64, 10)
    state = ElasticState(_Weights(whole), lambda obj: obj, lambda: 0, lambda: 1, commit_every=5)
    result = elastic_fit(state, loop_settings(_cfg()), whole, data, callbacks=[SampleLedger()])
    assert np.array_equal(whole.w, plain.w)                     # the same steps, bit for bit
    assert [h["train_loss"] for h in result.history] == [h["train_loss"] for h in expected.history]
    assert result.steps == expected.optimizer_steps == 28 and state._commits == 28 // 5 + 2   # + one per epoch
    assert np.array_equal(np.array(result.reads), np.ones((2, len(data.x_train)), dtype=int))
    # A job resumed from the commit after step 10 (mid-epoch 0) ends where the uninterrupted one did.
    resumed = Elastic(64, 10)
    state = ElasticState(_Weights(resumed), lambda obj: obj, lambda: 0, lambda: 1, commit_every=5)
    first = Elastic(64, 10)
    fit_loop(_cfg(), first, data, callbacks=[_StopAt(10)])
    resumed.w = first.w.copy()
    state.position.epoch, state.position.consumed, state.position.step = 0, 10 * 100, 10
    again = elastic_fit(state, loop_settings(_cfg()), resumed, data)
    assert np.array_equal(resumed.w, whole.w) and again.steps == 28
    assert again.history[-1]["world_size"] == 1.0


def test_the_ledger_keeps_its_counts_in_the_committed_state_and_the_deprecated_switch_adds_one(data):
    from hvdsync.elastic import ElasticState
    from hvdsync.fitting import fit_elastic_with

    class Elastic(NumpyBackend):
        model = optimizer = None

        def refresh(self):
            pass

    states = []

    def make_state(model, optimizer, cfg, codec=None):
        states.append(ElasticState(_Weights(backend), lambda obj: obj, lambda: 0, lambda: 1, commit_every=5))
        return states[-1]

    backend = Elastic(64, 10)
    with pytest.warns(DeprecationWarning, match=r"callbacks=\[SampleLedger\(\)\]"):
        result = fit_elastic_with(lambda cfg: None, lambda cfg, data, broadcast: backend, make_state,
                                  lambda func, state: func(state), _cfg(), data, record_reads=True)
    # Every sample once per epoch; the counts are user objects of the state (committed, rolled back with it).
    assert np.array_equal(np.array(result.reads), np.ones((2, len(data.x_train)), dtype=int))
    assert np.array_equal(states[0].user["reads"], result.reads)
    steps = -(-len(data.x_train) // 100)
    assert [row[1] for row in result.timeline] == list(range(1, 2 * steps + 1))       # the job's step after each
    assert [sum(row[3:]) for row in result.timeline[:steps]] == [min(100, len(data.x_train) - 100 * i)
                                                                 for i in range(steps)]
    # Handed in as a callback, the same ledger fills the result without any switch (and without a warning).
    ledger, backend = SampleLedger(), Elastic(64, 10)
    again = fit_elastic_with(lambda cfg: None, lambda cfg, data, broadcast: backend, make_state,
                             lambda func, state: func(state), _cfg(), data, callbacks=[ledger])
    assert again.reads == ledger.reads == result.reads and len(again.timeline) == 2 * steps
    # Outside an elastic run the ledger keeps the counts itself.
    plain = SampleLedger()
    fit_loop(_cfg(epochs=1), NumpyBackend(64, 10), data, callbacks=[plain])
    assert plain.reads == [[1] * len(data.x_train)]


class _StopAt(Callback):
    def __init__(self, steps):
        self.steps = steps

    def on_step_end(self, ctx):
        ctx.stop_training = ctx.global_step == self.steps


def test_the_evaluation_is_cut_by_the_shares_in_force_and_adds_up_to_the_whole_test_set(data):
    # Two rank views of one trained model: each scores its part; together they score every test sample once.
    trained = NumpyBackend(64, 10)
    fit_loop(_cfg(epochs=1), trained, data)
    whole = trained.count_correct(data.x_test, data.y_test)
    shares = {"now": None}
    ranks = []
    for rank in (0, 1):
        view = NumpyBackend(64, 10)
        view.w, view.rank, view.size = trained.w, rank, 2
        ranks.append(array_evaluator(view, data, batch=64, shares=lambda: shares["now"]))
    n = len(data.x_test)
    for now, counts in ((None, [(n + 1) // 2, n // 2]), ((0.75, 0.25), split_counts(n, (0.75, 0.25)).tolist())):
        shares["now"] = now                               # read at every call: adaptive shares change per epoch
        scored = [evaluate()["test_accuracy"] for evaluate in ranks]
        assert [count for _, count in scored] == counts
        assert sum(correct for correct, _ in scored) == whole


class _Warns(Callback):
    """A callback with a warning line for the result, and the order of the callbacks' first hook."""

    def __init__(self, name, order):
        self.name, self.order, self.messages = name, order, [f"{name} says so"]

    def on_train_begin(self, ctx):
        self.order.append(self.name)


def test_the_observer_is_handed_in_and_runs_first_and_every_callback_s_messages_reach_the_result(data):
    from hvdsync.core.train import loop

    order = []
    result = loop.fit_loop(loop_settings(_cfg(epochs=1)), NumpyBackend(64, 10), data,
                           callbacks=[_Warns("mine", order)], observer=_Warns("observer", order))
    assert order == ["observer", "mine"]
    assert result.warnings == ["observer says so", "mine says so"]
    # Without an observer the loop runs none of its own (the elastic loop's case).
    assert loop.fit_loop(loop_settings(_cfg(epochs=1)), NumpyBackend(64, 10), data).warnings == []


class _CountsGathers(NumpyBackend):
    def __init__(self, *args):
        super().__init__(*args)
        self.gathers = 0

    def allgather(self, values):
        self.gathers += 1
        return super().allgather(values)


def test_the_config_layer_hands_the_loop_the_observer_the_config_describes(data):
    # The observer all-gathers the ranks' per-step figures every `monitor.every` steps: hvdsync.fitting makes it
    # from the config and hands it to the loop; observe=False hands none (the loop makes no observer of its own).
    cfg = Config.from_dict({**_cfg(epochs=1).to_dict(), "monitor": {"every": 3}})
    steps = plan_for(cfg, len(data.x_train), 1).steps_per_epoch(0, 0)
    observed, plain = _CountsGathers(64, 10), _CountsGathers(64, 10)
    fit_loop(cfg, observed, data)
    fit_loop(cfg, plain, data, observe=False)
    assert steps > 6 and observed.gathers - plain.gathers == steps // 3


@pytest.mark.parametrize("name", ["Callback", "TrainContext", "FitResult"])
def test_the_hooks_old_path_in_the_loop_imports_for_one_release_and_warns_with_the_adapters_name(name):
    from hvdsync.core.train import _context, callbacks, loop

    with pytest.warns(DeprecationWarning) as caught:
        value = getattr(loop, name)
    assert value is getattr(callbacks if name == "Callback" else _context, name)
    message = str(caught[0].message)
    assert f"import {name} from your adapter" in message and "0.4.0" in message
    assert f"hvdsync.torch.{name}" in message and f"hvdsync.tensorflow.{name}" in message
    assert caught[0].filename == __file__
    with pytest.raises(AttributeError, match="hvdsync.core.train.loop"):
        loop.NotAName  # noqa: B018
