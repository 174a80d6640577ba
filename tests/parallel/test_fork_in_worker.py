"""A worker that forks (a torch DataLoader starting its worker processes) right after an all-reduce never hangs.

Horovod's background thread drops its references to an op's tensors after the op; torch then takes the GIL for a
tensor that has a Python object, and without scripts/horovod-patches/0006 the thread created and deleted a Python
thread state each time, holding CPython's runtime lock outside the GIL. A fork() at that moment left the child
with the lock held, and on CPython 3.11 before its fix (gh-112275) the child slept forever in
PyOS_AfterFork_Child: a DataLoader waited for a batch that never came and the other rank for its all-reduce (a
hung 2-worker job about once in 40 runs of tests/parallel/torch_user_data_workers.py). Forking right after
``synchronize`` hits that moment often: 7 of 2,000 children hung on the unpatched build.
"""
from hvdsync import launch


def fork_after_each_allreduce(n: int) -> dict:
    import os
    import time

    import horovod.torch as hvd
    import torch

    hvd.init()
    t = torch.zeros(1000)                     # a tensor with a Python object, as a DataLoader's or a gradient
    hung = 0
    for _ in range(n):
        hvd.synchronize(hvd.allreduce_async_(t, name="fork_stress"))
        pid = os.fork()                      # while the background thread lets go of the op's tensors
        if pid == 0:
            os._exit(0)
        deadline = time.monotonic() + 3
        while os.waitpid(pid, os.WNOHANG)[0] == 0:
            if time.monotonic() > deadline:  # a child that has not exited in 3 s is stuck after the fork
                hung += 1
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                break
            time.sleep(0.0002)
    return {"forks": n, "hung": hung}


def test_no_child_hangs_when_a_worker_forks_right_after_an_allreduce():
    results = launch.run(fork_after_each_allreduce, args=(500,), np=2, progress=False, timeout=400)
    assert [r["forks"] for r in results] == [500, 500]
    assert [r["hung"] for r in results] == [0, 0]
