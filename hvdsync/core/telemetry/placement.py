"""Where the ranks ran: the hosts of a job and the ranks on each, as MLflow run parameters.

A multi-host run is compared with others by where it ran (two hosts of 2 ranks is not one host of 4), and a slow or
failed rank is found on its host. Every rank names its host in one all-gather at the start; rank 0 records:

* ``hosts``: Horovod's ``-H`` form in rank order, ``node1:2,node2:2``;
* ``hosts.count``: how many hosts;
* ``hosts.ranks``: the ranks of each host, ``node1=0,1;node2=2,3``;
* in a Slurm job, ``slurm.job_id``, ``slurm.nodelist`` (Slurm's compressed form, ``node[1-2]``) and
  ``slurm.tasks_per_node`` (``2(x2)``), from the job's environment (:func:`slurm_params`).

The host name is the one Horovod's launcher gave the worker (``HOROVOD_HOSTNAME``: the name in ``-H`` or the
hostfile, which is how a user knows the host), else this machine's host name (a launcher that does not set it).
"""
from __future__ import annotations

import os
import socket

# Bytes a host name may take in the all-gather (DNS names are at most 253).
HOST_BYTES = 256


def host_name() -> str:
    return os.environ.get("HOROVOD_HOSTNAME") or socket.gethostname()


def placement_params(hosts_by_rank: list[str]) -> dict[str, str]:
    """The run parameters for the host of each rank (index = rank).

    >>> placement_params(["a", "a", "b", "b"])
    {'hosts': 'a:2,b:2', 'hosts.count': '2', 'hosts.ranks': 'a=0,1;b=2,3'}
    """
    ranks: dict[str, list[int]] = {}
    for rank, host in enumerate(hosts_by_rank):
        ranks.setdefault(host, []).append(rank)
    return {"hosts": ",".join(f"{h}:{len(r)}" for h, r in ranks.items()), "hosts.count": str(len(ranks)),
            "hosts.ranks": ";".join(f"{h}={','.join(map(str, r))}" for h, r in ranks.items())}


def slurm_params(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The Slurm job this rank runs in, as run parameters; {} outside Slurm.

    >>> slurm_params({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_TASKS_PER_NODE": "2(x2)"})
    {'slurm.job_id': '7', 'slurm.nodelist': 'node[1-2]', 'slurm.tasks_per_node': '2(x2)'}
    """
    environ = os.environ if environ is None else environ
    names = {"slurm.job_id": "SLURM_JOB_ID", "slurm.nodelist": "SLURM_JOB_NODELIST",
             "slurm.tasks_per_node": "SLURM_TASKS_PER_NODE"}
    if not environ.get("SLURM_JOB_ID"):
        return {}
    return {param: environ[name] for param, name in names.items() if environ.get(name)}
