"""``hvdsync train`` as one task of a Slurm job step: ``srun --mpi=pmix hvdsync train ...`` in a batch script.

Slurm starts one process per rank on every node of the allocation through its own daemons, without ssh between the
nodes (which many HPC sites do not allow). Each task is then a Horovod worker: no launcher, no host list; Horovod's
MPI controller takes the rank, the size and the peers from the MPI library, which gets them from Slurm's PMIx server
in the step (``--mpi=pmix``). Rank 0 tracks the run in MLflow as under any launcher, and adds the job id, the node list
and the tasks per node (:func:`hvdsync.core.telemetry.placement.slurm_params`).

Checked in every task before Horovod starts, each one line (printed by task 0 only, so the job's log holds it once):

* the installed Horovod has no MPI controller: srun cannot start it (Gloo needs a launcher's rendezvous), so the
  line names both fixes, a Horovod built with MPI or one ``hvdsync train --hosts slurm`` in the batch script;
* the step's ``--mpi`` plugin is one this MPI cannot take its ranks from (Debian's Open MPI 4.1 speaks PMIx, not
  PMI-2; with ``--mpi=none`` every task would be a world of one), with the plugins that would work;
* ``--np`` (or ``train.np``) given and not the number of tasks srun started.

Which pairs work, measured on Debian 12 (Slurm 22.05.8, Open MPI 4.1.4): ``--mpi=pmix`` (and ``pmix_v4``) yes;
``--mpi=pmi2`` and ``--mpi=none`` stop in ``MPI_Init`` ("... on a NULL communicator") on every task.
"""
from __future__ import annotations

import contextlib
import os
from typing import Mapping

from hvdsync.config import Config, ConfigError
from hvdsync.launch.base import Launcher, Start, mpi_built
from hvdsync.launch.mpi import mpi_speaks

def in_step(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this process is one of several tasks of a job step that ``srun`` started (a batch script is not:
    Slurm sets the step variables for srun's tasks only; one task, ``srun -n1 hvdsync train --np 4``, stays a
    launcher of its own workers)."""
    tasks = environ.get("SLURM_STEP_NUM_TASKS", "")
    return tasks.isdigit() and int(tasks) > 1 and bool(environ.get("SLURM_PROCID"))


def _plugin_kind(mpi_type: str) -> str:
    """``pmix_v4`` -> ``pmix``; ``pmi2`` -> ``pmi2``; ``none`` (or unset) -> ``none``."""
    mpi_type = mpi_type or "none"
    return "pmix" if mpi_type.startswith("pmix") else mpi_type


def check_step(np_given: int | None, mpi_built: bool, environ: Mapping[str, str] = os.environ,
               speaks: set[str] | None = None) -> int:
    """The checks of a task before Horovod starts (see the module's docstring); returns the step's task count."""
    tasks = int(environ["SLURM_STEP_NUM_TASKS"])
    if not mpi_built:
        raise ConfigError(
            f"srun started {tasks} tasks of hvdsync train, but this Horovod was built without MPI (Gloo only), which "
            "srun cannot start; rebuild it with MPI (apt-get install openmpi-bin libopenmpi-dev, then "
            "bash scripts/build_horovod.sh, or `make install`) or run one `hvdsync train --hosts slurm` in the batch "
            "script instead of srun (workers over ssh)")
    mpi_type = environ.get("SLURM_MPI_TYPE", "none")
    if speaks is not None and _plugin_kind(mpi_type) not in speaks:
        usable = ", ".join(f"--mpi={kind}" for kind in sorted(speaks)) or "none (this MPI has no PMI support)"
        raise ConfigError(
            f"srun --mpi={mpi_type}: this MPI cannot take its ranks from Slurm's {mpi_type!r} plugin (every task "
            f"would stop in MPI_Init or train alone); use {usable} (`srun --mpi=list` shows this Slurm's plugins)")
    if np_given is not None and np_given != tasks:
        raise ConfigError(
            f"np: {np_given} is not allowed inside this job step: srun started {tasks} tasks "
            f"({environ.get('SLURM_STEP_NUM_NODES', '?')} nodes, {environ.get('SLURM_STEP_TASKS_PER_NODE', '?')} "
            f"tasks per node), one rank each; leave --np out or give --np {tasks} (or srun -n {np_given})")
    return tasks


class SlurmStep(Launcher):
    """The template's subclass for one task of an srun step: Slurm placed the tasks, each is a rank, so the placement
    is only the step's task count and the start trains this task's rank under Horovod's MPI controller. No job run
    is made here: every task would make one; rank 0's tracking makes the job's (as under any launcher)."""

    name = "slurm"

    def __init__(self, np_given: int | None = None) -> None:
        super().__init__(np_given=np_given)

    def placement(self, cfg: Config) -> int:
        return check_step(self.where["np_given"], mpi_built(), speaks=mpi_speaks())

    def job_run(self, cfg: Config, continue_run: str | None = None) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def start(self, cfg: Config, placed: int, how: Start) -> list:
        from hvdsync.launch import worker
        from hvdsync.launch.quiet import quiet_imports

        cfg = cfg.replace(train={"np": placed})
        # The MPI controller, even where a Gloo rendezvous left variables behind in the environment.
        os.environ["HOROVOD_CONTROLLER"] = "mpi"
        quiet_imports()
        return [worker.adapter(cfg).fit(cfg)]

    def result(self, results: list):
        return results[0]  # this task's FitResult, as the adapter made it


def train_in_step(cfg: Config, np_given: int | None):
    """Check the step, then train as this task's rank; returns this rank's FitResult (the caller prints rank 0's).
    ``SlurmStep(np_given).train(cfg)`` is the same.

    A ConfigError from the checks is raised in every task; the caller prints it from task 0 only."""
    return SlurmStep(np_given).train(cfg)
