"""Every codec and mixed precision on real Horovod workers (2 processes, Gloo), in both frameworks.

One worker job per framework (tests/parallel/codecs_workers.py) trains digits with every codec, comparing the ranks'
parameters after every step, then forces an fp16 overflow on rank 0 only; each test asserts one promise.
"""
import cloudpickle
import pytest

from hvdsync import launch
from tests.parallel import codecs_workers

cloudpickle.register_pickle_by_value(codecs_workers)
FRAMEWORKS = ["torch", "tensorflow"]


@pytest.fixture(scope="module", params=FRAMEWORKS)
def checks(request):
    results = launch.run(codecs_workers.all_checks, args=(request.param,), np=2, progress=False)
    assert len(results) == 2
    plain, momentum = results[0]["runs"][:len(codecs_workers.CODECS)], results[0]["runs"][len(codecs_workers.CODECS):]
    runs = {(r["config"]["sync"]["compression"], r["config"]["sync"]["error_feedback"]): r for r in plain}
    momentum_runs = {(r["config"]["sync"]["compression"], r["config"]["sync"]["momentum_correction"]): r
                     for r in momentum}
    for (spec, ef), r in runs.items():   # shown with pytest -s (and on failure)
        print(f"{request.param:<10} {spec:<11} ef={ef!s:<5} accuracy {r['test_accuracy']:.4f} "
              f"bytes/step {r['wire']['bytes'] / r['optimizer_steps']:>8.0f}")
    for (spec, mc), r in momentum_runs.items():
        print(f"{request.param:<10} {spec:<11} momentum 0.9, correction={mc!s:<5} accuracy {r['test_accuracy']:.4f}")
    return {"framework": request.param, "runs": runs, "momentum_runs": momentum_runs,
            "overflow": results[0]["overflow"], "accumulate": results[0]["accumulate"], "rank1": results[1]}


def test_ranks_hold_identical_parameters_after_every_step(checks):
    for key, r in {**checks["runs"], **checks["momentum_runs"]}.items():
        assert r["step_spread_max"] == 0.0 and r["param_spread"] == 0.0, key
        assert r["optimizer_steps"] == 220, key


def test_counted_wire_bytes_equal_the_codec_formula(checks):
    for key, r in checks["runs"].items():
        assert r["wire"]["bytes"] == r["wire_bytes_per_step_formula"] * r["optimizer_steps"], key
        assert r["allreduce_rounds"] == r["optimizer_steps"], key   # one reduction per step, however many pieces


def test_the_codecs_own_time_is_counted_where_python_runs_it(checks):
    # PyTorch's adapter times each codec's kernels (not its collectives): WireCounter.codec_seconds, what the link
    # benchmark's cost model takes as the encoding. TensorFlow runs them in a compiled step: 0, not a wrong figure.
    for (spec, _ef), r in checks["runs"].items():
        seconds = r["wire"]["codec_seconds"]
        if checks["framework"] == "tensorflow" or spec == "none":
            assert seconds == 0.0 or (spec == "none" and seconds < 1.0), (spec, seconds)
        else:
            assert 0.0 < seconds < sum(r["phase_seconds"].values()), (spec, seconds)


def test_compression_ratios(checks):
    runs = checks["runs"]
    none = runs[("none", True)]["wire"]["bytes"]
    assert none == 4 * runs[("none", True)]["numel"] * 220
    assert runs[("fp16", True)]["wire"]["bytes"] * 2 == none        # exactly half
    assert runs[("bf16", True)]["wire"]["bytes"] * 2 == none
    assert none / runs[("topk:0.01", True)]["wire"]["bytes"] >= 50   # values + indices counted
    assert 3.9 < none / runs[("int8", True)]["wire"]["bytes"] <= 4
    assert none / runs[("randk:0.1", True)]["wire"]["bytes"] >= 10
    assert none / runs[("powersgd:2", True)]["wire"]["bytes"] > 9    # 10x on this small MLP; the benchmark's: > 20x
    assert runs[("fp16", True)]["wire"]["dtypes"] == ["float16"]
    assert runs[("bf16", True)]["wire"]["dtypes"] == ["int16"]       # bfloat16 bit patterns (see codecs/cast.py)
    assert runs[("topk:0.01", True)]["wire"]["dtypes"] == ["float32", "int32"]
    assert runs[("int8", True)]["wire"]["dtypes"] == ["float32", "int8"]


def test_each_codec_trains_digits_above_its_stated_accuracy(checks):
    for spec, ef, stated in codecs_workers.CODECS:
        assert checks["runs"][(spec, ef)]["test_accuracy"] >= stated, (spec, ef)


def test_targets_against_no_compression(checks):
    runs = checks["runs"]
    none = runs[("none", True)]["test_accuracy"]
    for spec in ("fp16", "bf16", "int8"):
        assert runs[(spec, True)]["test_accuracy"] >= none - 0.005, spec
    assert runs[("topk:0.01", True)]["test_accuracy"] >= none - 0.01
    # powersgd:2's target (within 1 point, >= 20x fewer bytes) is for the benchmark's wide MLP
    # (benchmarks/compression.py); on this 4,810-parameter MLP it is held to its stated accuracy only.
    # Error feedback is what makes top-1% work: without it, the same steps reach measurably less.
    assert runs[("topk:0.01", False)]["test_accuracy"] < runs[("topk:0.01", True)]["test_accuracy"] - 0.02


def test_momentum_correction_makes_topk_train_with_sgd_momentum(checks):
    runs = checks["momentum_runs"]
    for spec, mc, stated in codecs_workers.MOMENTUM:
        assert runs[(spec, mc)]["test_accuracy"] >= stated, (spec, mc)
    # Without the correction the residual's late values are amplified by the optimizer's momentum a second time.
    assert runs[("topk:0.01", True)]["test_accuracy"] > runs[("topk:0.01", False)]["test_accuracy"] + 0.02
    # The velocity travels in the codec: the same bytes as plain top-k.
    assert runs[("topk:0.01", True)]["wire"]["bytes"] == checks["runs"][("topk:0.01", True)]["wire"]["bytes"]


@pytest.mark.parametrize("spec", ["topk:0.01", "powersgd:2"])
def test_accumulation_runs_the_codec_once_per_allreduce_on_the_summed_gradients(checks, spec):
    r = checks["accumulate"][spec]
    # accumulate 2 (two micro-batches of 16 per rank) took the same steps as accumulate 1 (one of 32) ...
    assert r["max_param_diff"] <= 1e-5 * max(1.0, r["max_param"]), r
    # ... with one reduction per optimizer step, and the codec's state advanced once per step, not per micro-batch.
    assert r["reductions"] == r["steps"]
    if spec == "topk:0.01":
        assert r["codec_steps"] == r["steps"]
    # The monitor's gradient norm (both frameworks): the reduced gradient's, so the same on both ranks.
    assert r["grad_norm"] > 0 and r["grad_norm"] == checks["rank1"]["accumulate"][spec]["grad_norm"]


@pytest.mark.parametrize("spec", ["none", "topk:0.01"])
def test_a_forced_overflow_on_one_rank_skips_the_step_on_both_and_lowers_the_scale(checks, spec):
    rows = checks["overflow"][spec]
    at = 3
    # The lab's injection fired once, on rank 0, at that step (from outside: hvdsync has no switch for it) ...
    assert [r["injected"] for r in rows] == [int(i >= at) for i in range(len(rows))], spec
    assert [r["injected"] for r in checks["rank1"]["overflow"][spec]] == [0] * len(rows), spec
    assert [r["spread"] for r in rows] == [0.0] * len(rows), spec    # identical parameters after every step
    assert [r["skipped_steps"] for r in rows] == [int(i == at) for i in range(len(rows))], spec
    assert rows[at]["change"] == 0.0                                # the step was skipped ...
    assert rows[at]["scale_after"] == rows[at]["scale_before"] / 2  # ... and the scale halved,
    changes = [r["change"] for r in rows]
    assert [i for i, c in enumerate(changes) if i != at and not c > 0] == [], f"parameter change per step: {changes}"
    # on rank 1 too, which did not overflow itself.
    other = checks["rank1"]["overflow"][spec]
    assert [r["skipped_steps"] for r in other] == [r["skipped_steps"] for r in rows]
    assert [r["scale_after"] for r in other] == [r["scale_after"] for r in rows]
