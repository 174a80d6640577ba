"""Mixed precision, the framework-free half: what each ``train.precision`` means, and the number formats.

* ``fp32``: everything in float32.
* ``fp16``: the forward and backward passes in float16 where it is safe (torch ``autocast``, Keras
  ``mixed_float16``), parameters and the update in float32. float16's largest value is 65,504 and its smallest
  normal 6.1e-5: small gradients underflow to 0, so the loss is multiplied by a *loss scale* before the backward
  pass and the gradients divided by it before the update. The scale is dynamic: halved after a step whose gradients
  hold an inf or nan (that step is skipped), doubled after a run of good steps. With several ranks the skip must be
  decided *together*: a rank that skips while another steps would leave the ranks with different parameters, so the
  adapters all-reduce "did any rank overflow?" before deciding (``hvdsync/torch/precision.py``,
  ``hvdsync/tensorflow/precision.py``).
* ``bf16``: bfloat16 compute. It keeps float32's 8 exponent bits (range to 3.4e38), so no loss scale is needed;
  it has 7 mantissa bits against float16's 10, so it rounds more coarsely (notebook 09 plots both).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Policy:
    """What one ``train.precision`` value asks of an adapter.

    Attributes:
        name: ``fp32``, ``fp16`` or ``bf16``.
        compute_dtype: dtype of the forward/backward compute (``None``: float32, no autocast).
        loss_scaling: scale the loss dynamically and skip non-finite steps (fp16 only).
    """

    name: str
    compute_dtype: str | None
    loss_scaling: bool


POLICIES = {
    "fp32": Policy("fp32", None, False),
    "fp16": Policy("fp16", "float16", True),
    "bf16": Policy("bf16", "bfloat16", False),
}


def policy(precision: str) -> Policy:
    """The :class:`Policy` of a ``train.precision`` value."""
    try:
        return POLICIES[precision]
    except KeyError:
        raise ValueError(f"train.precision: {precision!r} is not allowed; choose one of: {', '.join(POLICIES)}") from None


def format_facts() -> dict[str, dict[str, float]]:
    """Range and precision of the formats (largest finite value, smallest normal, machine epsilon), for tables and
    the plots of notebook 09; bfloat16's from its definition (float32's exponent, 7 stored mantissa bits)."""
    facts = {name: {"max": float(np.finfo(t).max), "tiny": float(np.finfo(t).tiny), "eps": float(np.finfo(t).eps)}
             for name, t in (("float16", np.float16), ("float32", np.float32))}
    f32 = np.finfo(np.float32)
    facts["bfloat16"] = {"max": float((2 - 2 ** -7) * 2.0 ** 127), "tiny": float(f32.tiny), "eps": 2.0 ** -7}
    return facts
