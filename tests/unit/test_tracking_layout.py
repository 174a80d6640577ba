"""What a run says about itself in a real MLflow store: the headline figures from whole-run totals after warm-up (and
``runs compare`` showing exactly those, pointing at the faster run where the last epoch points the other way), the
name and tags that say what ran, MLflow's user and source tags, the experiment's kind; and which environment
variables the record keeps."""
import getpass
import json
import statistics

import mlflow
import pytest

from hvdsync.config import Config, TrackingConfig
from hvdsync.core.telemetry import record, runlabel
from hvdsync.core.telemetry.profiling import PHASES
from hvdsync.core.telemetry.runsummary import KEY, WARMUP_EPOCHS, run_summary
from hvdsync.core.telemetry.tracking import make_tracker
from hvdsync.launch import cli
from hvdsync.launch.runs import runs_url

# (samples, seconds) per epoch. A: a slow first epoch and a fast last one; B: steady and, after warm-up, faster
# overall. A's last epoch says A is faster (2000 against 1250 samples/s); its whole run after warm-up says B is.
EPOCHS = {"A": [(1000, 10.0), (1000, 1.0), (1000, 1.0), (1000, 0.5)],
          "B": [(1000, 2.0), (1000, 0.8), (1000, 0.8), (1000, 0.8)]}
# Per-step phase times (data, compute, sync_wait, update) of each gathered interval: A waits longer on the wire.
PHASE_STEP = {"A": (0.01, 0.1, 0.08, 0.01), "B": (0.01, 0.1, 0.02, 0.01)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two runs written by rank 0's tracker into one real store, as the training loop logs them."""
    tmp = tmp_path_factory.mktemp("layout")
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    ids = {}
    # The job's command line as a launcher hands it to its workers: fixed here, so that neither pytest's own argv (a
    # worker of pytest-xdist is `python -c`) nor a variable another test's in-process CLI call left decides the tag.
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HVDSYNC_COMMAND_LINE", json.dumps(["jobs/train.py", "--np", "2"]))
        _write_runs(uri, tmp, ids)
    return uri, ids


def _write_runs(uri, tmp, ids):
    for label, compression in (("A", "none"), ("B", "fp16")):
        cfg = Config().replace(sync={"compression": compression, "accumulate": 2})
        tracker = make_tracker(TrackingConfig(tracking_uri=uri, experiment="layout", spool_dir=str(tmp / "spool"),
                                              flush_seconds=300), 0)
        tracker.start({**cfg.flat(), "world_size": 2}, tags={"framework": "torch"})
        tracker.log_params({"hosts": "h:2", "hosts.count": "1"})          # what the observer logs once it knows
        step = 0
        for epoch, (samples, seconds) in enumerate(EPOCHS[label]):
            for _interval in range(2):
                step += 5
                jitter = 1.0 + 0.1 * epoch                                  # phases differ between epochs
                tracker.log_metrics({f"phase/{p}_seconds": v * jitter for p, v in zip(PHASES, PHASE_STEP[label])},
                                    step=step)
            tracker.log_metrics({"train_loss": 1.0 / (epoch + 1), "test_accuracy": 0.5 + 0.1 * epoch,
                                 "epoch_seconds": seconds, "samples_per_second": samples / seconds,
                                 "step_seconds_max_rank": seconds / 10}, step=epoch)
        tracker.finish()
        ids[label] = tracker.run_id


def _history(client, run_id, key):
    return [m.value for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)]


def test_compare_shows_the_runs_whole_run_totals_and_names_the_faster_run(runs, tmp_path, capsys):
    uri, ids = runs
    client = mlflow.MlflowClient(uri)
    capsys.readouterr()
    assert cli.main(["runs", "compare", ids["A"], ids["B"], "--tracking-uri", uri, "--out", str(tmp_path / "c.png"),
                     "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    for label, run_id in ids.items():
        m = client.get_run(run_id).data.metrics
        # The figures compare shows are the ones the run logged ...
        for name, value in report["metrics"][run_id].items():
            if KEY + name in m:
                assert value == m[KEY + name], name
        # ... and they are the run's totals after warm-up, recomputed here from its per-epoch history.
        seconds = _history(client, run_id, "epoch_seconds")[WARMUP_EPOCHS:]
        rates = _history(client, run_id, "samples_per_second")[WARMUP_EPOCHS:]
        total = sum(r * s for r, s in zip(rates, seconds))
        assert report["metrics"][run_id]["samples_per_second"] == pytest.approx(total / sum(seconds))
        assert total == pytest.approx(sum(n for n, _s in EPOCHS[label][WARMUP_EPOCHS:]))
        assert m[KEY + "samples_per_second_median"] == pytest.approx(statistics.median(rates))
        # The phase breakdown beside it: the mean per-step phase times of the intervals after warm-up.
        kept = {p: _history(client, run_id, f"phase/{p}_seconds")[2 * WARMUP_EPOCHS:] for p in PHASES}
        phases = {p: statistics.fmean(v) for p, v in kept.items()}
        assert report["metrics"][run_id]["sync_wait_seconds"] == pytest.approx(phases["sync_wait"])
        assert report["metrics"][run_id]["comm_share"] == pytest.approx(phases["sync_wait"] / sum(phases.values()))
    a, b = (report["metrics"][ids[k]] for k in "AB")
    # The last epoch points one way, the whole run the other: compare follows the whole run.
    assert _history(client, ids["A"], "samples_per_second")[-1] > _history(client, ids["B"], "samples_per_second")[-1]
    assert report["fastest"] == ids["B"] and b["seconds_after_warmup"] < a["seconds_after_warmup"]
    # Same samples: the speed ratio is the inverse of the time ratio.
    ratio = report["ratios"][ids["B"]]
    assert ratio["samples_per_second"] == pytest.approx(1 / ratio["seconds_after_warmup"])
    assert a["comm_share"] > b["comm_share"]                                   # why A is slower
    assert report["differing"] == {"sync.compression": ["none", "fp16"]}

    assert cli.main(["runs", "compare", ids["A"], ids["B"], "--tracking-uri", uri, "--out", ""]) == 0
    out = capsys.readouterr().out
    assert f"fastest: {ids['B'][:8]}" in out
    row = next(line for line in out.splitlines() if line.startswith("comm_share"))
    assert len(row.split()) == 5                                               # name, then value (ratio) per run


def test_runs_are_named_and_tagged_for_what_ran_and_their_experiment_opens_on_runs(runs):
    uri, ids = runs
    client = mlflow.MlflowClient(uri)
    for run_id, compression in ((ids["A"], "none"), (ids["B"], "fp16")):
        run = client.get_run(run_id)
        tags = run.data.tags
        assert {k: tags.get(k) for k in ("framework", "hvdsync.np", "hvdsync.hosts", "hvdsync.compression",
                                         "hvdsync.mode", "hvdsync.accumulate", "hvdsync.elastic")} == {
            "framework": "torch", "hvdsync.np": "2", "hvdsync.hosts": "1", "hvdsync.compression": compression,
            "hvdsync.mode": "allreduce", "hvdsync.accumulate": "2", "hvdsync.elastic": "false"}
        assert run.info.run_name == f"torch x2 1host {compression} allreduce acc2"
        assert tags["mlflow.user"] == getpass.getuser() and tags["mlflow.source.type"] == "LOCAL"
        assert tags["mlflow.source.name"] == "train.py"                     # the program MLflow's UI shows
    # The data set as an MLflow dataset input: the same data settings, the same digest.
    inputs = [client.get_run(ids[k]).inputs.dataset_inputs for k in "AB"]
    assert [[(i.dataset.name, i.dataset.source_type) for i in x] for x in inputs] == [[("digits", "hvdsync")]] * 2
    assert inputs[0][0].dataset.digest == inputs[1][0].dataset.digest
    exp = client.get_experiment(client.get_run(ids["A"]).info.experiment_id)
    assert exp.tags[runlabel.EXPERIMENT_KIND_TAG] == runlabel.EXPERIMENT_KIND
    # `runs ui` prints the link to the newest run's experiment, opened as model training (not GenAI).
    assert runs_url(uri, 5000) == f"http://127.0.0.1:5000/#/experiments/{exp.experiment_id}?workflowType=machine_learning"


def test_summary_and_names_from_their_parts():
    # One epoch: nothing to leave out. No epochs: nothing to say.
    one = run_summary([{"samples_per_second": 100.0, "epoch_seconds": 2.0}])
    assert one["samples_per_second"] == 100.0 and one["warmup_epochs"] == 0.0
    assert run_summary([]) == {}
    facts = runlabel.facts({**Config().replace(elastic={"enabled": True}, train={"np": 3}).flat(), "world_size": 2})
    assert facts["hvdsync.np"] == "3"                           # elastic: the size it started at, not the current
    assert runlabel.run_name(facts, ["sync.compression=fp16", "sync.accumulate=4"]).startswith(
        "compression=fp16 accumulate=4 | torch x3")


def test_the_record_keeps_tensorflows_own_variables_not_every_tf_name():
    env = {"TF_ENABLE_ONEDNN_OPTS": "0", "TF_CPP_MIN_LOG_LEVEL": "2", "TF_CLI_CONFIG_FILE": "/x/terraform.rc",
           "TF_VAR_region": "eu", "OMP_NUM_THREADS": "1"}
    assert record.recorded_env(env) == {"TF_ENABLE_ONEDNN_OPTS": "0", "TF_CPP_MIN_LOG_LEVEL": "2",
                                        "OMP_NUM_THREADS": "1"}


@pytest.mark.parametrize(("argv", "source"), [
    (["/opt/venv/bin/hvdsync", "train", "--np", "2"], "hvdsync train"),
    (["/opt/venv/bin/hvdsync", "--debug", "sweep", "--set", "a=1,2"], "hvdsync sweep"),
    (["jobs/train_keras.py", "--epochs", "3"], "train_keras.py"),
])
def test_the_source_tag_is_the_program_and_its_subcommand(monkeypatch, argv, source):
    monkeypatch.setenv("HVDSYNC_COMMAND_LINE", json.dumps(argv))
    assert runlabel.source_tags()["mlflow.source.name"] == source
