"""One measuring protocol for every suite: the order contenders run in, how many times, and how a ratio is stated.

* Order (:func:`schedule`): counterbalanced within every repeat. ``abba``: each contender runs twice per repeat,
  the contenders forward then backward (A B B A; A B C C B A), so each one's mean position in the repeat is the same
  and a machine that gets steadily busier or quieter (the load rose from 1.0 to 2.7 in one earlier sweep) lands on
  all alike. ``random``: the same runs in an order drawn from a seed that the record keeps.
* Repeats: at least :data:`MIN_REPEATS` in a record (``--quick`` runs are marked ``quick`` and exempt).
* The figure (:func:`ratio_ci`): a contender's step time over another's as the ratio of their means over the
  repeats, with its bootstrap 95 % confidence interval (the repeats resampled in pairs: both sides of one repeat
  share its machine's state); ``scipy.stats.bootstrap`` (BCa) where scipy is installed, the percentile bootstrap in
  numpy otherwise. Not a min-max bracket: that only widens with more repeats.
* Raw times: every run's per-step seconds are kept in the record, so anyone can recompute any figure.
* The record's form (:func:`problems`, :func:`check`): the names a reader of ``benchmarks/results/models/`` relies
  on, each error naming its field.

    sched = protocol.schedule(["hvdsync", "ddp"], repeats=10)          # [(0, "hvdsync"), (0, "ddp"), (0, "ddp"), ...]
    ratio, (low, high) = protocol.ratio_ci(hvdsync_means, ddp_means)  # one mean per repeat and contender
    protocol.check(record)                                            # RecordError naming every bad field
"""
from __future__ import annotations

import math
import random
import statistics

import numpy as np

ORDERS = ("abba", "random")
MIN_REPEATS = 10
CONFIDENCE = 0.95
RESAMPLES = 9999

MODELS = ("resnet50", "bert-base")
FRAMEWORKS = ("torch", "tensorflow")
RATES = ("1gbit", "10gbit", "none")
CONTENDERS = ("ddp", "mwms", "horovod")
ROW_FIELDS = ("model", "framework", "ranks", "rate", "codec", "contender", "ratio", "ci", "repeats",
              "compute_to_comm")
PREDICTION_FIELDS = ("model", "framework", "ranks", "rate", "codec", "predicted_s", "measured_s", "held_out")


class RecordError(ValueError):
    """A record that does not have the protocol's form; the message names every bad field."""


# ---- order ----------------------------------------------------------------------------------------------------
def schedule(contenders: list[str], repeats: int = MIN_REPEATS, order: str = "abba",
             seed: int | None = None) -> list[tuple[int, str]]:
    """``(repeat, contender)`` in the order they run: every contender twice per repeat, forward then backward
    (``abba``) or shuffled from ``seed`` (``random``; required then, and kept in the record)."""
    if not contenders or len(set(contenders)) != len(contenders):
        raise ValueError(f"contenders: {contenders!r}; expected distinct names, at least one")
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        raise ValueError(f"repeats: {repeats!r} is not allowed; expected an integer >= 1")
    if order not in ORDERS:
        raise ValueError(f"order: {order!r} is not allowed; choose one of: {', '.join(ORDERS)}")
    if order == "random" and seed is None:
        raise ValueError("order 'random' needs a seed (the record keeps it, so the order can be rebuilt)")
    rng = random.Random(seed)
    out = []
    for r in range(repeats):
        runs = list(contenders) + list(reversed(contenders))
        if order == "random":
            rng.shuffle(runs)
        out += [(r, c) for c in runs]
    return out


def mean_positions(sched: list[tuple[int, str]]) -> dict[str, float]:
    """Each contender's mean position within its repeats (0 = first): equal for all under ``abba``."""
    pos: dict[str, list[int]] = {}
    seen: dict[int, int] = {}
    for r, c in sched:
        pos.setdefault(c, []).append(seen.get(r, 0))
        seen[r] = seen.get(r, 0) + 1
    return {c: statistics.fmean(p) for c, p in pos.items()}


# ---- figures --------------------------------------------------------------------------------------------------
def ratio_ci(a, b, confidence: float = CONFIDENCE, seed: int = 0, resamples: int = RESAMPLES
             ) -> tuple[float, list[float]]:
    """``mean(a) / mean(b)`` and its bootstrap confidence interval; ``a[i]`` and ``b[i]`` are one repeat's
    figures of the two sides (resampled together). One repeat: the interval is the point (nothing to resample)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.ndim != 1 or a.shape != b.shape or len(a) == 0:
        raise ValueError(f"ratio_ci: a and b must be equal-length 1-d sequences (got {a.shape} and {b.shape})")
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b)) and np.all(a > 0) and np.all(b > 0)):
        raise ValueError("ratio_ci: every time must be finite and > 0")
    ratio = float(a.mean() / b.mean())
    if len(a) == 1 or (np.all(a == a[0]) and np.all(b == b[0])):
        return ratio, [ratio, ratio]
    try:
        from scipy import stats
    except ImportError:
        stats = None
    if stats is not None:
        res = stats.bootstrap((a, b), lambda x, y, axis=-1: x.mean(axis=axis) / y.mean(axis=axis), paired=True,
                              vectorized=True, confidence_level=confidence, n_resamples=resamples, method="BCa",
                              random_state=np.random.default_rng(seed))
        low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
        if math.isfinite(low) and math.isfinite(high):   # BCa degenerates on a few repeats: percentile then
            return ratio, [low, high]
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(a), size=(resamples, len(a)))
    boot = a[idx].mean(axis=1) / b[idx].mean(axis=1)
    tail = (1 - confidence) / 2
    return ratio, [float(np.quantile(boot, tail)), float(np.quantile(boot, 1 - tail))]


# ---- the record's form ----------------------------------------------------------------------------------------
def _number(v, positive: bool = True) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and (v > 0 or not positive)


def _count(v, least: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= least


def _config(where: str, x: dict) -> list[str]:
    out = []
    if x.get("model") not in MODELS:
        out.append(f"{where}.model: {x.get('model')!r}; expected one of {', '.join(MODELS)}")
    if x.get("framework") not in FRAMEWORKS:
        out.append(f"{where}.framework: {x.get('framework')!r}; expected one of {', '.join(FRAMEWORKS)}")
    if not _count(x.get("ranks"), 2):
        out.append(f"{where}.ranks: {x.get('ranks')!r}; expected an integer >= 2")
    if x.get("rate") not in RATES:
        out.append(f"{where}.rate: {x.get('rate')!r}; expected one of {', '.join(RATES)}")
    if not isinstance(x.get("codec"), str) or not x.get("codec"):
        out.append(f"{where}.codec: {x.get('codec')!r}; expected a codec's name (none, fp16, powersgd:2 ...)")
    return out


def _entries(key: str, entries: list, fields: tuple, out: list[str]):
    """Each object of ``record[key]`` with its place (``rows[3]``), after adding to ``out`` what every entry must
    carry: an object, the ``fields``, a configuration of the known values (a missing field named once, not twice)."""
    for i, entry in enumerate(entries):
        where = f"{key}[{i}]"
        if not isinstance(entry, dict):
            out.append(f"{where}: expected an object")
            continue
        missing = [k for k in fields if k not in entry]
        out += [f"{where}.{k}: missing" for k in missing]
        out += [x for x in _config(where, entry) if x.split(":")[0].rsplit(".", 1)[1] not in missing]
        yield where, entry


def problems(record: dict) -> list[str]:
    """Everything wrong with ``record``'s form, one line per field (empty: it has the form). A record marked
    ``"quick": true`` may have fewer than :data:`MIN_REPEATS` repeats; no other rule bends."""
    if not isinstance(record, dict):
        return [f"record: expected a JSON object, got {type(record).__name__}"]
    out = []
    quick = record.get("quick") is True
    least = 1 if quick else MIN_REPEATS
    proto = record.get("protocol")
    repeats = None
    if not isinstance(proto, dict):
        out.append("protocol: missing; expected {order, repeats}")
    else:
        missing = [k for k in ("order", "repeats") if k not in proto]
        out += [f"protocol.{k}: missing" for k in missing]
        if "order" in proto and proto["order"] not in ORDERS:
            out.append(f"protocol.order: {proto['order']!r}; expected one of {', '.join(ORDERS)}")
        if proto.get("order") == "random" and not isinstance(proto.get("seed"), int):
            out.append("protocol.seed: missing; a random order is recorded with its seed")
        if "repeats" in proto:
            repeats = proto["repeats"]
            if not _count(repeats, least):
                out.append(f"protocol.repeats: {repeats!r}; expected an integer >= {least}")
    rows = record.get("rows")
    if not isinstance(rows, list) or not rows:
        out.append("rows: missing or empty; expected a list of rows")
        rows = []
    for where, row in _entries("rows", rows, ROW_FIELDS, out):
        if "contender" in row and row["contender"] not in CONTENDERS:
            out.append(f"{where}.contender: {row['contender']!r}; expected one of {', '.join(CONTENDERS)}")
        if "ratio" in row and not _number(row["ratio"]):
            out.append(f"{where}.ratio: {row['ratio']!r}; expected a number > 0 (hvdsync / contender, step time)")
        if "ci" in row:
            ci = row["ci"]
            if not (isinstance(ci, list) and len(ci) == 2 and all(_number(v) for v in ci) and ci[0] <= ci[1]):
                out.append(f"{where}.ci: {ci!r}; expected [low, high], numbers > 0, low <= high")
        if "repeats" in row and not _count(row["repeats"], least):
            out.append(f"{where}.repeats: {row['repeats']!r}; expected an integer >= {least}")
        if "compute_to_comm" in row:
            c = row["compute_to_comm"]
            # Only an unlimited link may lack one: no rate was set, and none was measured.
            if not (_number(c) or (c is None and row.get("rate") == "none")):
                out.append(f"{where}.compute_to_comm: {c!r}; expected a number > 0 (null only at rate none)")
    preds = record.get("predictions")
    if not isinstance(preds, list):
        out.append("predictions: missing; expected a list (empty where nothing was predicted)")
        preds = []
    for where, p in _entries("predictions", preds, PREDICTION_FIELDS, out):
        for k in ("predicted_s", "measured_s"):
            if k in p and not _number(p[k]):
                out.append(f"{where}.{k}: {p[k]!r}; expected seconds > 0")
        if "held_out" in p and not isinstance(p["held_out"], bool):
            out.append(f"{where}.held_out: {p['held_out']!r}; expected true or false")
    return out


def record_problems(record: dict) -> list[str]:
    """:func:`problems` for a kept record (``benchmarks/results/models/``): a ``--quick`` run is none."""
    quick = ["quick: a --quick run is not a record (its figures mean nothing)"] \
        if isinstance(record, dict) and record.get("quick") is True else []
    return quick + problems(record)


def check(record: dict) -> None:
    """Raise :class:`RecordError` listing every field :func:`problems` finds wrong."""
    wrong = problems(record)
    if wrong:
        raise RecordError("the record does not have the protocol's form:\n  " + "\n  ".join(wrong))
