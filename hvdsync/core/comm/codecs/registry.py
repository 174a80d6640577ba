"""Codecs by name: ``sync.compression`` is ``name`` or ``name:param`` (``topk:0.01``, ``powersgd:2``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from hvdsync.core.comm.codecs.base import Codec
from hvdsync.core.comm.codecs.cast import BF16, Cast
from hvdsync.core.comm.codecs.powersgd import PowerSGD
from hvdsync.core.comm.codecs.quantize import Int8
from hvdsync.core.comm.codecs.sparse import RandK, TopK


@dataclass(frozen=True)
class CodecEntry:
    """How a name becomes a codec.

    Args:
        make: builds the codec, from the parameter when ``param`` is set.
        param: ``"ratio"`` (a number in (0, 1]), ``"rank"`` (an integer >= 1) or ``None`` (no parameter).
        default: the parameter when the config gives the name alone.
    """

    make: Callable[..., Codec]
    param: str | None = None
    default: float | int | None = None

    def usage(self, name: str) -> str:
        return name if self.param is None else f"{name}:<{self.param}>"


CODECS: dict[str, CodecEntry] = {
    "none": CodecEntry(lambda: Cast("none", None)),
    "fp16": CodecEntry(lambda: Cast("fp16", "float16")),
    "bf16": CodecEntry(BF16),
    "topk": CodecEntry(TopK, "ratio", 0.01),
    "randk": CodecEntry(RandK, "ratio", 0.01),
    "int8": CodecEntry(Int8),
    "powersgd": CodecEntry(PowerSGD, "rank", 2),
}


def register_codec(name: str, make: Callable[..., Codec], param: str | None = None, default=None) -> None:
    """Make ``sync.compression: name`` (or ``name:param``) build ``make(param)``; for users' own codecs."""
    if param not in (None, "ratio", "rank"):
        raise ValueError(f"param: {param!r} is not allowed; choose one of: None, 'ratio', 'rank'")
    CODECS[name] = CodecEntry(make, param, default)


def choices() -> str:
    return ", ".join(entry.usage(name) for name, entry in CODECS.items())


def _parse_param(name: str, entry: CodecEntry, text: str):
    if entry.param == "ratio":
        try:
            value = float(text)
        except ValueError:
            value = None
        if value is None or not 0.0 < value <= 1.0:
            raise ValueError(f"the ratio of {name} must be a number in (0, 1], e.g. {name}:{entry.default}")
        return value
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"the rank of {name} must be an integer >= 1, e.g. {name}:{entry.default}")
    return value


def get_codec(spec: str) -> Codec:
    """The codec a ``sync.compression`` value names; a fresh object (codecs hold no state, but users' may).

    Raises ``ValueError`` naming the value and what is allowed.

    Example:
        >>> get_codec("topk:0.01").k(10_000)
        100
    """
    if not isinstance(spec, str):
        raise ValueError(f"{spec!r} is not allowed; choose one of: {choices()}")
    name, _, text = spec.partition(":")
    entry = CODECS.get(name)
    if entry is None:
        raise ValueError(f"{spec!r} is not allowed; choose one of: {choices()}")
    if entry.param is None:
        if text:
            raise ValueError(f"{spec!r} is not allowed; {name} takes no parameter")
        return entry.make()
    try:
        return entry.make(_parse_param(name, entry, text) if text else entry.default)
    except ValueError as exc:
        raise ValueError(f"{spec!r} is not allowed; {exc}") from None
