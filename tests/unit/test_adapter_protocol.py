"""Both adapters keep one contract (hvdsync.adapter): the same module files, the same ``__all__`` and the same
signatures (parameter names, kinds, order and defaults). What exists in one framework only is named below, each
with why; a name listed here that stops being true fails too, so the list cannot rot."""
from __future__ import annotations

import importlib
import inspect
import pathlib
import re

import pytest

from hvdsync import adapter

ROOT = pathlib.Path(__file__).resolve().parents[2]
FRAMEWORKS = ("torch", "tensorflow")

# Module files one adapter has and the other has not.
MODULES_ONLY_IN = {
    "torch": {
        "grouped.py": "the choice between Horovod's per-tensor backward hooks (their all-reduces overlap backward) and "
                      "one grouped call after backward (sync.grouped_mb) is PyTorch's; TensorFlow's optimizer always "
                      "reduces in one grouped call",
    },
    "tensorflow": {
        "callbacks.py": "Keras callbacks for model.fit (broadcast, metric average, warm-up, MLflow, elastic commits); "
                        "PyTorch has no fit of its own, and the shared loop's hooks are the Callback both export",
    },
}

# Public names (``__all__``) one adapter exports and the other does not.
NAMES_ONLY_IN = {
    "torch": {
        "TorchBackend": "the backend class the shared loop drives, named after its framework (its mirror is "
                        "TensorFlowBackend); the constructors differ where the frameworks do (see below)",
        "LoaderSteps": "a torch DataLoader over PlanSampler as the shared loop's steps (fit(train=...)); TensorFlow's "
                       "fit reads arrays, and a tf.data pipeline of the user's goes through Keras' fit",
    },
    "tensorflow": {
        "TensorFlowBackend": "the backend class the shared loop drives, named after its framework (its mirror is "
                             "TorchBackend)",
        "DistributedOptimizer": "Keras' compile takes an optimizer object of Keras' class, so the distributed one is "
                                "a class of its own; PyTorch's are Horovod's DistributedOptimizer and hvdsync's "
                                "wrappers, which distributed_optimizer returns",
        "callbacks": "Keras callbacks for model.fit (see callbacks.py above)",
        "keras_fit": "elastic model.fit of the user's own compiled Keras model; PyTorch has no fit of its own (its "
                     "elastic loops are fit_elastic and run_elastic, which both have)",
    },
}

# Constructor parameters one framework's class has and the protocol has not (all others must match).
PARAMETERS_ONLY_IN = {
    ("torch", "CNN"): {
        "in_channels": "torch's first Conv2d needs its input channels when it is built; Keras infers them at the "
                       "first call",
        "channels_last": "PyTorch's own layout is (N, C, H, W); hvdsync's images are (N, H, W, C), Keras' own layout",
    },
    ("tensorflow", "CNN"): {
        "kwargs": "Keras' layer arguments (name, dtype, trainable), which Keras' saving hands back to the constructor",
    },
    ("torch", "CodecCompressor"): {
        "in_place": "Horovod's torch optimizer hands compress/decompress the gradient buffer itself, which can be "
                    "reused step to step; TensorFlow's reducer runs in a graph, where tensors are values",
    },
    ("tensorflow", "PlanSampler"): {
        "growth_lr": "TensorFlow's sampler is also the Keras callback that sets each epoch's learning rate under a "
                     "growing batch; PyTorch's is a torch Sampler that never sees the optimizer (the shared loop or "
                     "the user's loop sets the rate)",
    },
}

# Members whose whole signature is the framework's own.
SIGNATURES_OF_THE_FRAMEWORK = {
    "SyncBatchNormalization": "each is its framework's own batch-norm layer with the statistics reduced across "
                              "ranks, so it takes that layer's arguments (nn.BatchNorm1d's, "
                              "keras.layers.BatchNormalization's)",
}


@pytest.fixture(scope="module")
def adapters():
    return {fw: importlib.import_module(f"hvdsync.{fw}") for fw in FRAMEWORKS}


def _members() -> list[str]:
    return sorted(name for name, _ in inspect.getmembers(adapter.Adapter, inspect.isfunction)
                  if not name.startswith("_"))


def _files(framework: str) -> set[str]:
    root = ROOT / "hvdsync" / framework
    return {p.relative_to(root).as_posix() for p in root.rglob("*.py")}


def _shape(signature: inspect.Signature, drop=()) -> list[tuple]:
    """Names, kinds, order and defaults (types are each framework's own)."""
    return [(p.name, p.kind, p.default) for p in signature.parameters.values() if p.name not in drop]


def test_the_exceptions_say_why():
    reasons = [*(r for d in MODULES_ONLY_IN.values() for r in d.values()),
               *(r for d in NAMES_ONLY_IN.values() for r in d.values()),
               *(r for d in PARAMETERS_ONLY_IN.values() for r in d.values()), *SIGNATURES_OF_THE_FRAMEWORK.values()]
    assert all(len(r) > 40 for r in reasons)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_every_adapter_has_the_protocols_module_files_and_only_the_named_others(framework):
    assert _files(framework) - set(MODULES_ONLY_IN[framework]) == set(adapter.MODULES)
    other = next(fw for fw in FRAMEWORKS if fw != framework)
    for name in MODULES_ONLY_IN[framework]:  # named as one framework's only: it is, and the other lacks it
        assert name in _files(framework) and name not in _files(other), name


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_every_adapter_exports_the_protocols_names_and_only_the_named_others(adapters, framework):
    exported = set(adapters[framework].__all__)
    assert len(exported) == len(adapters[framework].__all__)  # no name twice
    assert exported - set(NAMES_ONLY_IN[framework]) - set(_from_the_core()) == set(_members())
    other = next(fw for fw in FRAMEWORKS if fw != framework)
    for name in NAMES_ONLY_IN[framework]:
        assert name in exported and name not in adapters[other].__all__, name
    for name in exported:
        assert hasattr(adapters[framework], name), name


def _from_the_core() -> dict[str, str]:
    return {name: module for module, names in adapter.FROM_THE_CORE.items() for name in names}


def test_both_adapters_export_the_core_s_names_a_user_s_script_needs_as_the_core_s_own_objects(adapters):
    # A loop of your own (loss_scale, ShardPlan), a Keras script (StepSpread, SampleLedger, get_codec): from the
    # adapter, never from hvdsync.core, and the same object in both, so there is nothing to keep in step.
    names = _from_the_core()
    assert {"loss_scale", "ShardPlan", "SampleLedger", "StepSpread", "get_codec", "FitResult"} <= set(names)
    for name, module in names.items():
        core = getattr(importlib.import_module(module), name)
        assert [getattr(adapters[fw], name) for fw in FRAMEWORKS] == [core, core], name
        assert all(name in adapters[fw].__all__ for fw in FRAMEWORKS), name
    assert not set(names) & set(_members()) and not set(names) & {n for d in NAMES_ONLY_IN.values() for n in d}


@pytest.mark.parametrize("name", _members())
def test_every_shared_name_has_the_protocols_signature_in_both_frameworks(adapters, name):
    if name in SIGNATURES_OF_THE_FRAMEWORK:
        return
    want = _shape(inspect.signature(getattr(adapter.Adapter, name)), drop=("self",))
    for framework in FRAMEWORKS:
        extra = PARAMETERS_ONLY_IN.get((framework, name), {})
        got = inspect.signature(getattr(adapters[framework], name))
        assert set(extra) <= set(got.parameters), (framework, name, extra)  # the named extras exist
        assert _shape(got, drop=extra) == want, (framework, name)


def test_the_callback_is_one_class_for_both(adapters):
    assert adapters["torch"].Callback is adapters["tensorflow"].Callback


def test_the_backends_are_each_others_mirror(adapters):
    # The constructors differ where the frameworks do: TensorFlow's takes the MixedPrecision made before the model
    # was built (Keras' dtype policy applies to the layers built after it) and the input shape a subclassed Keras
    # model does not declare; torch's takes the precision's name and moves the model to its device itself.
    assert adapters["torch"].TorchBackend.framework == "torch"
    assert adapters["tensorflow"].TensorFlowBackend.framework == "tensorflow"
    for backend in (adapters["torch"].TorchBackend, adapters["tensorflow"].TensorFlowBackend):
        assert all(callable(getattr(backend, m)) for m in ("train_step", "count_correct", "allgather", "parameters",
                                                           "grad_norm", "refresh", "scale_learning_rate"))


def _words(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def test_both_optimizers_state_the_one_accumulation_rule_in_the_same_words(adapters):
    for framework in FRAMEWORKS:
        assert _words(adapter.ACCUMULATION_RULE) in _words(adapters[framework].distributed_optimizer.__doc__), framework


def test_fit_refuses_what_tensorflow_cannot_honour_by_name():
    from hvdsync.tensorflow.train import _check_arguments

    with pytest.raises(ValueError, match=r"^train: .*data=Dataset\(.*PlanSampler"):
        _check_arguments(None, None, object(), 0)
    with pytest.raises(ValueError, match=r"^num_workers: 2 is not allowed .*num_parallel_calls"):
        _check_arguments(None, None, None, 2)
