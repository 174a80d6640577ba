"""Several senders opening one fresh SQLite store at once (an elastic job's old and new rank 0) all get a working
client: MLflow's schema migrations run one process at a time. Without the lock, two of three such processes failed
here with ``duplicate column name``."""
import subprocess
import sys

CODE = "import sys; from hvdsync.core.telemetry.sender import open_client; open_client(sys.argv[1]).search_experiments()"


def test_concurrent_senders_open_a_fresh_sqlite_store(tmp_path):
    uri = f"sqlite:///{tmp_path / 'fresh.db'}"
    procs = [subprocess.Popen([sys.executable, "-c", CODE, uri], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(3)]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    assert [rc for rc, _ in results] == [0, 0, 0], "\n".join(err[-800:] for _, err in results)
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=uri)
    assert client.get_experiment_by_name("Default") is not None
