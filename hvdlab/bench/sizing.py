"""Where a step's compute stands against its gradient's ring time, here and on a GPU cluster.

``compute_to_comm`` is a step's compute (forward, backward and update, no synchronisation) over the time a ring
all-reduce of its fp32 gradient takes on the link: ``2 (n - 1) / n x gradient bytes / link bytes per second``
(:func:`ring_seconds`). Below 1 the link is the bottleneck; above 1 compute is, and the synchronisation can hide
behind the backward pass. Every row of a ``benchmarks/models.py`` record carries it (:func:`compute_to_comm`).

The benchmark's inputs (:data:`SIZES`) are chosen so that a step's compute on one core here (test hosts split this
machine's cores, one core each) is about what the same model's step takes on a GPU, from the published figures in
:data:`GPU_REFERENCE`. The gradient is the same model's, and the ring is computed for the same n and link rate on
both sides, so equal compute makes ``compute_to_comm`` equal at every rate (1 Gbit/s and 10 Gbit/s alike):
:func:`gpu_compute_to_comm` is the figure a row's own is set against.

GPU figures taken (NVIDIA DeepLearningExamples, github.com/NVIDIA/DeepLearningExamples, read 2026-12-08):

* ResNet-50 v1.5, PyTorch (``PyTorch/Classification/ConvNets/resnet50v1.5/README.md``, "Training performance",
  pytorch-21.03 NGC container, 224 x 224 images, ``main.py``'s default batch of 256 per GPU, which the table does
  not restate): 1 x V100 16GB, mixed precision, 1,200 img/s -> 0.213 s a step; 1 x A100 80GB, mixed precision,
  2,470 img/s -> 0.104 s a step.
* BERT: the same repository's PyTorch BERT README (``PyTorch/LanguageModeling/BERT/README.md``, pytorch:19.07-py3)
  gives pre-training throughput for BERT-large only: 1 x V100 32GB (DGX-1), sequence length 128, mixed precision
  batch 64: 171.52 sequences/s -> 0.373 s a step. BERT-base's step is taken as that over the ratio of their training
  FLOPs per token (:func:`bert_flops_per_token`: 6 x the non-embedding parameters + the attention scores' 12 x
  layers x length x hidden), 3.5: 0.106 s a step. This is an estimate from a published figure, not a published
  BERT-base figure.

The links: 1 Gbit/s and 10 Gbit/s Ethernet, the rates the sweep sets with ``tc``; a GPU cluster on such Ethernet
(no NVLink or InfiniBand between nodes) is where data-parallel synchronisation costs what it costs here.

Where this machine cannot follow: BERT-base's step here does not come near the V100 figure at any input. At 16
tokens, batch 1, on one core: forward and backward alone took 0.38-0.47 s (load ~2.5); the whole step with SGD's
momentum update over its 110 M parameters (which reads and writes ~1.3 GB a step, whatever the input) 1.4-4.3 s
(``benchmarks/models.py compute`` pinned to one core, load 8-10). So its ``compute_to_comm`` here is 10x or more
the V100 figure's: its rows sit where a much slower GPU's, or a much faster link's, would. Each row records its own
figure and the GPU's beside it.
"""
from __future__ import annotations

from dataclasses import dataclass

FP32 = 4


@dataclass(frozen=True)
class Reference:
    gpu: str
    batch: int
    step_s: float
    source: str


def bert_flops_per_token(layers: int, hidden: int, ffn: int, seq: int) -> float:
    """Training FLOPs per token of a BERT encoder: 6 x its non-embedding weights (forward 2, backward 4 per weight)
    plus the attention scores and their use (QK^T and AV: 2 x 2 x seq x hidden per layer forward, x 3 with the
    backward)."""
    weights = layers * (4 * hidden * hidden + 2 * hidden * ffn)
    return 6 * weights + 12 * layers * seq * hidden


_BERT_LARGE_OVER_BASE = bert_flops_per_token(24, 1024, 4096, 128) / bert_flops_per_token(12, 768, 3072, 128)

GPU_REFERENCE: dict[str, list[Reference]] = {
    "resnet50": [
        Reference("1 x V100 16GB, mixed precision", 256, 256 / 1200,
                  "NVIDIA DeepLearningExamples PyTorch resnet50v1.5 README: 1,200 img/s"),
        Reference("1 x A100 80GB, mixed precision", 256, 256 / 2470,
                  "NVIDIA DeepLearningExamples PyTorch resnet50v1.5 README: 2,470 img/s"),
    ],
    "bert-base": [
        Reference("1 x V100 32GB, mixed precision, sequence 128", 64, 64 / 171.52 / _BERT_LARGE_OVER_BASE,
                  "NVIDIA DeepLearningExamples PyTorch BERT README: BERT-large 171.52 sequences/s, scaled by "
                  f"training FLOPs per token (large / base = {_BERT_LARGE_OVER_BASE:.2f})"),
    ],
}

# The inputs of a full run, per rank: ResNet-50 64 x 64 images, 2 a step; BERT-base 16 tokens, 1 sequence a step.
# Measured on one core of this machine (torch 2.13, 1 intra-op thread, the machine shared): ResNet-50 at 64 x 64,
# batch 2, 0.18-0.23 s for forward and backward (load ~2.5) and 0.20-0.27 s for the whole step with its update
# (load 8-10), against V100's 0.213 s; BERT-base at 16 tokens, batch 1: see above.
SIZES = {"resnet50": {"size": 64, "batch": 2}, "bert-base": {"size": 16, "batch": 1}}
# --quick: every path in seconds; the figures mean nothing.
QUICK_SIZES = {"resnet50": {"size": 32, "batch": 2}, "bert-base": {"size": 8, "batch": 1}}


def ring_seconds(gradient_bytes: float, ranks: int, link_bits_per_second: float) -> float:
    """A ring all-reduce's transfer time: each rank sends 2 (n - 1) / n of the buffer over its link."""
    if ranks < 1 or link_bits_per_second <= 0:
        raise ValueError(f"ranks {ranks!r}, link rate {link_bits_per_second!r}: expected ranks >= 1 and a rate > 0")
    return 2 * (ranks - 1) / ranks * gradient_bytes / (link_bits_per_second / 8)


def compute_to_comm(compute_s: float, gradient_bytes: float, ranks: int,
                    link_bits_per_second: float | None) -> float | None:
    """A measured step's compute over its gradient's ring time on the link; None where there is no rate to set it
    against (an unlimited link no probe measured) or one rank (no ring)."""
    if link_bits_per_second is None or ranks < 2:
        return None
    return compute_s / ring_seconds(gradient_bytes, ranks, link_bits_per_second)


def gpu_compute_to_comm(model: str, gradient_bytes: float, ranks: int, link_bits_per_second: float) -> dict:
    """Each published GPU reference's ``compute_to_comm`` for ``model`` at ``ranks`` on the same link."""
    if model not in GPU_REFERENCE:
        raise ValueError(f"model: {model!r} is not allowed; choose one of: {', '.join(GPU_REFERENCE)}")
    return {r.gpu: compute_to_comm(r.step_s, gradient_bytes, ranks, link_bits_per_second)
            for r in GPU_REFERENCE[model]}
