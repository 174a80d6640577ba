"""What a run reports: MLflow tracking (one run per job, a local spool and a sender), observers, system metrics,
the cross-rank monitor, the run's record, profiling, Horovod's timeline and the progress stream."""
