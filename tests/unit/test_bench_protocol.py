"""hvdlab.bench.protocol: a counterbalanced order, a ratio's bootstrap confidence interval that covers the truth and
narrows with repeats, and a record check that names every missing or wrong field; hvdlab.bench.sizing's ring time
and compute-to-communication ratio."""
import copy
import math

import numpy as np
import pytest

from hvdlab.bench import protocol, sizing


# ---- order ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("contenders", [["hvdsync", "ddp"], ["a", "b", "c"]])
def test_abba_runs_each_contender_twice_per_repeat_at_the_same_mean_position(contenders):
    sched = protocol.schedule(contenders, repeats=3)
    assert len(sched) == 3 * 2 * len(contenders)
    for r in range(3):
        runs = [c for rep, c in sched if rep == r]
        assert runs == contenders + contenders[::-1]
    positions = protocol.mean_positions(sched)
    assert len(set(positions.values())) == 1, positions


def test_a_fixed_order_is_not_balanced():
    # What the check above guards against: A B in every repeat puts A first each time.
    fixed = [(r, c) for r in range(4) for c in ("hvdsync", "ddp")]
    positions = protocol.mean_positions(fixed)
    assert positions["hvdsync"] < positions["ddp"]


def test_random_order_needs_a_seed_and_is_rebuilt_from_it():
    with pytest.raises(ValueError, match="seed"):
        protocol.schedule(["a", "b"], 4, order="random")
    one = protocol.schedule(["a", "b", "c"], 6, order="random", seed=7)
    assert one == protocol.schedule(["a", "b", "c"], 6, order="random", seed=7)
    assert one != protocol.schedule(["a", "b", "c"], 6, order="random", seed=8)
    for r in range(6):
        assert sorted(c for rep, c in one if rep == r) == ["a", "a", "b", "b", "c", "c"]


@pytest.mark.parametrize("kw,match", [({"repeats": 0}, "repeats"), ({"order": "abab"}, "order"),
                                      ({"repeats": 2.5}, "repeats")])
def test_bad_schedule_arguments_are_named(kw, match):
    with pytest.raises(ValueError, match=match):
        protocol.schedule(["a", "b"], **{"repeats": 2, **kw})


# ---- the confidence interval ----------------------------------------------------------------------------------
def _pairs(rng, n, ratio, noise=0.08):
    # One repeat = one machine state (a shared factor) times each side's own noise.
    load = rng.uniform(0.8, 1.6, n)
    b = 0.2 * load * rng.lognormal(0, noise, n)
    a = ratio * 0.2 * load * rng.lognormal(0, noise, n)
    return a, b


def test_the_interval_covers_a_known_ratio_about_95_percent_of_the_time():
    rng = np.random.default_rng(1)
    true = 1.07
    hits = 0
    trials = 60
    for t in range(trials):
        a, b = _pairs(rng, 12, true)
        # The ratio of means' expectation is the true ratio (the noise factors have the same mean on both sides).
        ratio, (low, high) = protocol.ratio_ci(a, b, seed=t, resamples=2000)
        assert low <= ratio <= high
        hits += low <= true <= high
    # 95 % nominal; BCa on 12 pairs undercovers a little. 60 trials: below 0.8 would be far outside chance.
    assert hits / trials >= 0.8, hits


def test_the_interval_excludes_parity_when_the_difference_is_real():
    a, b = _pairs(np.random.default_rng(2), 20, 1.25, noise=0.03)
    _, (low, high) = protocol.ratio_ci(a, b)
    assert low > 1.0


def test_the_interval_narrows_with_repeats():
    rng = np.random.default_rng(3)
    width = {}
    for n in (10, 40, 160):
        ws = []
        for t in range(5):
            a, b = _pairs(rng, n, 1.0)
            _, (low, high) = protocol.ratio_ci(a, b, seed=t, resamples=2000)
            ws.append(high - low)
        width[n] = np.median(ws)
    assert width[10] > width[40] > width[160], width
    # ~1/sqrt(n): 4x the repeats, about half the width.
    assert 0.3 < width[40] / width[10] < 0.75, width


def test_the_numpy_bootstrap_agrees_without_scipy(monkeypatch):
    import builtins

    a, b = _pairs(np.random.default_rng(4), 15, 0.9)
    with_scipy = protocol.ratio_ci(a, b)
    real_import = builtins.__import__

    def no_scipy(name, *args, **kw):
        if name == "scipy" or name.startswith("scipy."):
            raise ImportError(name)
        return real_import(name, *args, **kw)

    monkeypatch.setattr(builtins, "__import__", no_scipy)
    without = protocol.ratio_ci(a, b)
    assert without[0] == with_scipy[0]
    assert without[1][0] < without[0] < without[1][1]
    assert abs(without[1][0] - with_scipy[1][0]) < 0.05 and abs(without[1][1] - with_scipy[1][1]) < 0.05


@pytest.mark.parametrize("a,b", [([1.0, 2.0], [1.0]), ([], []), ([1.0, -1.0], [1.0, 1.0]), ([1.0, math.nan], [1, 1])])
def test_bad_times_are_refused(a, b):
    with pytest.raises(ValueError, match="ratio_ci"):
        protocol.ratio_ci(a, b)


# ---- the record's form ----------------------------------------------------------------------------------------
GOOD = {
    "protocol": {"order": "abba", "repeats": 10},
    "rows": [{"model": "resnet50", "framework": "torch", "ranks": 2, "rate": "1gbit", "codec": "none",
              "contender": "ddp", "ratio": 0.98, "ci": [0.95, 1.01], "repeats": 10, "compute_to_comm": 0.26}],
    "predictions": [{"model": "bert-base", "framework": "torch", "ranks": 4, "rate": "10gbit", "codec": "fp16",
                     "predicted_s": 1.2, "measured_s": 1.3, "held_out": True}],
}


def test_a_good_record_passes():
    assert protocol.problems(GOOD) == []
    protocol.check(GOOD)


@pytest.mark.parametrize("field", ["order", "repeats"])
def test_each_missing_protocol_field_is_named(field):
    bad = copy.deepcopy(GOOD)
    del bad["protocol"][field]
    with pytest.raises(protocol.RecordError, match=rf"protocol\.{field}: missing"):
        protocol.check(bad)


@pytest.mark.parametrize("field", protocol.ROW_FIELDS)
def test_each_missing_row_field_is_named(field):
    bad = copy.deepcopy(GOOD)
    del bad["rows"][0][field]
    wrong = protocol.problems(bad)
    assert wrong == [f"rows[0].{field}: missing"]


@pytest.mark.parametrize("field", protocol.PREDICTION_FIELDS)
def test_each_missing_prediction_field_is_named(field):
    bad = copy.deepcopy(GOOD)
    del bad["predictions"][0][field]
    assert protocol.problems(bad) == [f"predictions[0].{field}: missing"]


@pytest.mark.parametrize("section", ["protocol", "rows", "predictions"])
def test_each_missing_section_is_named(section):
    bad = copy.deepcopy(GOOD)
    del bad[section]
    assert [p.split(":")[0] for p in protocol.problems(bad)] == [section]


@pytest.mark.parametrize("where,value,named", [
    (("protocol", "order"), "fixed", "protocol.order"),
    (("protocol", "repeats"), 3, "protocol.repeats"),
    (("rows", 0, "rate"), "1gbps", "rows[0].rate"),
    (("rows", 0, "contender"), "gloo", "rows[0].contender"),
    (("rows", 0, "ci"), [1.01, 0.95], "rows[0].ci"),
    (("rows", 0, "ratio"), float("inf"), "rows[0].ratio"),
    (("rows", 0, "ranks"), 1, "rows[0].ranks"),
    (("rows", 0, "compute_to_comm"), None, "rows[0].compute_to_comm"),
    (("predictions", 0, "held_out"), "yes", "predictions[0].held_out"),
    (("predictions", 0, "predicted_s"), 0, "predictions[0].predicted_s"),
])
def test_each_wrong_value_is_named(where, value, named):
    bad = copy.deepcopy(GOOD)
    target = bad
    for k in where[:-1]:
        target = target[k]
    target[where[-1]] = value
    wrong = protocol.problems(bad)
    assert len(wrong) == 1 and wrong[0].startswith(named + ":"), wrong


def test_quick_records_may_have_few_repeats_and_unlimited_rows_no_ratio_to_the_link():
    quick = copy.deepcopy(GOOD)
    quick.update(quick=True)
    quick["protocol"]["repeats"] = quick["rows"][0]["repeats"] = 2
    assert protocol.problems(quick) == []
    quick["rows"][0].update(rate="none", compute_to_comm=None)
    assert protocol.problems(quick) == []
    quick["protocol"]["order"] = "random"
    assert protocol.problems(quick) == ["protocol.seed: missing; a random order is recorded with its seed"]


# ---- sizing ---------------------------------------------------------------------------------------------------
def test_ring_time_and_compute_to_comm():
    grad = 25_557_032 * 4
    # 2 ranks: each sends the whole buffer once (2 (n - 1) / n = 1); 4 ranks: 1.5 times.
    assert sizing.ring_seconds(grad, 2, 1e9) == pytest.approx(grad / 125e6)
    assert sizing.ring_seconds(grad, 4, 1e9) == pytest.approx(1.5 * grad / 125e6)
    assert sizing.compute_to_comm(0.4, grad, 2, 1e9) == pytest.approx(0.4 / (grad / 125e6))
    # Ten times the rate, ten times the ratio.
    assert sizing.compute_to_comm(0.4, grad, 2, 1e10) == pytest.approx(10 * sizing.compute_to_comm(0.4, grad, 2, 1e9))
    assert sizing.compute_to_comm(0.4, grad, 2, None) is None
    with pytest.raises(ValueError, match="rate"):
        sizing.ring_seconds(grad, 2, 0)


def test_gpu_references_put_resnet50_near_a_quarter_at_1gbit():
    grad = 25_557_032 * 4
    got = sizing.gpu_compute_to_comm("resnet50", grad, 2, 1e9)
    v100 = got["1 x V100 16GB, mixed precision"]
    assert v100 == pytest.approx((256 / 1200) / (grad / 125e6))
    assert 0.2 < v100 < 0.3
    # BERT-base: large's published step over their FLOPs ratio (~3.5).
    assert 3.3 < sizing.bert_flops_per_token(24, 1024, 4096, 128) / sizing.bert_flops_per_token(12, 768, 3072, 128) < 3.8


# ---- the index's check reads the form ---------------------------------------------------------------------------
def test_the_index_check_names_a_bad_field_of_a_models_record(tmp_path):
    import json

    from hvdlab.bench import records

    root = tmp_path / "repo"
    (root / "benchmarks").mkdir(parents=True)
    (root / "benchmarks" / "models.py").write_text("")
    results = root / "benchmarks" / "results"
    (results / "models").mkdir(parents=True)
    bad = copy.deepcopy(GOOD)
    del bad["rows"][0]["ci"]
    (results / "models" / "2026-12-08-trial.json").write_text(json.dumps(bad))
    records.add(results, "models", "2026-12-08-trial", "python benchmarks/models.py", "a trial",
                runner="benchmarks/models.py", about="models")
    assert records.problems(results, root) == ["models/2026-12-08-trial: 2026-12-08-trial.json: rows[0].ci: missing"]
    (results / "models" / "2026-12-08-trial.json").write_text(json.dumps({**GOOD, "quick": True}))
    assert [p.split(": ")[2] for p in records.problems(results, root)] == ["quick"]
    (results / "models" / "2026-12-08-trial.json").write_text(json.dumps(GOOD))
    assert records.problems(results, root) == []
