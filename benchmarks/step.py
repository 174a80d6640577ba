"""Where a training step's time goes, contenders interleaved step by step in the same processes.

    python benchmarks/step.py latency            # torch CNN: Horovod hooks, one grouped call, fit's step, DDP (~2 min)
    python benchmarks/step.py tf-apply           # TensorFlow CNN: raw Horovod, the adapter API, fit's step
    python benchmarks/step.py fp16               # torch MLP 21 M: fp32 against fp16 steps, split into phases
    python benchmarks/step.py fp16-path          # one fp16 all-reduce split into cast, reduction, hook
    python benchmarks/step.py tf-eval            # TensorFlow's epoch evaluation: eager against traced in chunks
    python benchmarks/step.py latency --steps 3 --warmup 1   # tiny: every path (what the tests run)
    python benchmarks/step.py --record quiet latency --steps 150   # keep it: results/step/<date>-latency-quiet.*

Unlike ``training.py`` (each contender its own job, minutes apart), each part holds every contender in the *same*
processes and alternates them step by step, so machine noise lands on all alike and ratios of a few percent resolve
on a shared machine. Every part checks what it times: the contenders end with the same parameters (or, for fp16,
within its rounding), a wrong one fails the run. The parts, with their options (``PART --help``):

* ``latency`` (:mod:`hvdlab.bench.step_latency`): a small model's step, Horovod's per-tensor hooks vs one grouped
  call (hvdsync's default) vs ``fit``'s own step vs DDP; phases, sync after the last gradient, Horovod rounds per step;
* ``tf-apply`` (:mod:`hvdlab.bench.tf_apply_overhead`): hvdsync's Keras optimizer and ``fit``'s one-graph step
  against raw Horovod in one ``tf.function`` step, with CPU time and graph op counts;
* ``fp16`` (:mod:`hvdlab.bench.fp16_step`): the fp16 step against the fp32 one: phases, page faults, CPU, the
  all-reduce alone;
* ``fp16-path`` (:mod:`hvdlab.bench.fp16_path`): one fp16 all-reduce's parts, each timed alone;
* ``tf-eval`` (:mod:`hvdlab.bench.tf_eval`): the epoch's evaluation in TensorFlow, one process.
"""
import sys

from hvdlab.bench import fp16_path, fp16_step, step_latency, suite, tf_apply_overhead, tf_eval

SUITE_PARTS = {name: suite.Part(module.main, suite.first_line(module.__doc__))
               for name, module in (("latency", step_latency), ("tf-apply", tf_apply_overhead), ("fp16", fp16_step),
                                    ("fp16-path", fp16_path), ("tf-eval", tf_eval))}

if __name__ == "__main__":
    sys.exit(suite.run(__file__, SUITE_PARTS, doc=__doc__))
