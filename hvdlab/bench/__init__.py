"""The measuring code behind ``benchmarks/``: one runner per suite there (``benchmarks/<suite>.py``), and here what
the runners share and the parts that do not fit in a runner.

    suite, records                 a runner's parts and ``--record``; the records of ``benchmarks/results/`` and
                                   their generated index
    harness, report                the all-reduce variants and their measuring loop, rounds and tables
                                   (``allreduce.py``, ``knobs.py``)
    step_common, step_torch,       the training-step contenders, one file per framework, and their tables
    step_tf, train_tables          (``training.py``; ``step.py`` and ``knobs.py idle-loop`` reuse the models)
    step_latency, tf_apply_overhead, fp16_step, fp16_path, tf_eval     the parts of ``step.py``
    idle_loop, launch_overhead     parts of ``knobs.py``
    codec_seeds                    a part of ``compression.py``
    gpu_links                      a part of ``gpu.py``
    link_report, link_encode,      ``link.py``: its rows and tables, each codec's encoding time on the workers, DDP's
    link_ddp, link_probe           hooks over the same link, the link's rate as one TCP stream gets it
    shares_common, shares_timeline the straggler benchmarks' shared setup, and the ``timeline`` part of ``shares.py``
    protocol, sizing               the measuring protocol every suite follows (order, repeats, the ratio's confidence
                                   interval, the record's form) and where a step's compute stands against its ring
    models_step                    ``models.py``'s contenders on the real model sizes (hvdsync, tuned DDP, compute)

Importing this package imports nothing else: every module imports its framework where it measures.
"""
