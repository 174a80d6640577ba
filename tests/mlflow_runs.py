"""What the one-run tests read back from an MLflow store (tests/parallel, tests/hosts, tests/ray): the store's runs
and each metric's steps, with the assertion they all make spelled once."""
import mlflow


def only_run(uri: str):
    """(client, the store's one run): fails, listing them, where the store holds more or none."""
    client = mlflow.MlflowClient(tracking_uri=uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(runs) == 1, [(r.info.run_id, r.info.status) for r in runs]
    return client, runs[0]


def epochs(client, run_id: str, key: str = "train_loss") -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, key))


def one_finished_run(uri: str, run_id: str, count: int) -> dict:
    """The tags of the store's one run, which must be ``run_id``, ``FINISHED``, with each of the ``count`` epochs'
    train_loss and test_accuracy once."""
    client, run = only_run(uri)
    assert (run.info.run_id, run.info.status) == (run_id, "FINISHED")
    for key in ("train_loss", "test_accuracy"):
        assert epochs(client, run_id, key) == list(range(count)), key
    return run.data.tags
