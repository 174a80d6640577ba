"""Rows and tables of ``benchmarks/link.py``: what one run measured, what the cost model predicts for it, and the
ratios the issue's targets are stated in."""
from __future__ import annotations

import statistics

from hvdlab import costmodel, testhosts

ALPHA_S = 100e-6  # per-message cost of Gloo over TCP between namespaces: small next to the transfers here


def rate_bits(rate: str) -> float | None:
    """``"100mbit"`` -> 1e8 bits/s; ``"none"`` -> None (no limit)."""
    if rate == "none":
        return None
    try:
        return testhosts.rate_bits(rate)
    except ValueError:
        raise ValueError(f"rate: {rate!r} is not allowed; expected <number>kbit|mbit|gbit or none") from None


def bad_rates(rates: list[str]) -> list[str]:
    """The rates of ``rates`` that :func:`rate_bits` does not read (for a runner's one-line refusal)."""
    bad = []
    for r in rates:
        try:
            rate_bits(r)
        except ValueError:
            bad.append(r)
    return bad


def label(cfg: dict) -> str:
    """A run's column name: its codec, or its sync mode and period (``local_sgd:4``)."""
    sync = cfg["sync"]
    return sync["compression"] if sync["mode"] == "allreduce" else f"{sync['mode']}:{sync['period']}"


def calls_per_step(cfg: dict) -> float:
    """Horovod calls a run makes per step: its codec's rounds (:attr:`Codec.rounds`), or one every H steps for
    local SGD."""
    from hvdsync.core.comm.codecs.registry import get_codec

    sync = cfg["sync"]
    return get_codec(sync["compression"]).rounds if sync["mode"] == "allreduce" else 1 / sync["period"]


def summarise(result: dict, rate: str, link_bps: float, encode_s: float, link: costmodel.Link, n: int = 2) -> dict:
    """One hvdsync run (a :func:`hvdsync.launch.train_many` result) at ``rate``.

    The prediction: the step's compute (its non-sync part, measured) plus the codec's encode + decode time
    (measured on the workers, :mod:`hvdlab.bench.link_encode`) plus, per Horovod call the run makes
    (:func:`calls_per_step`), the call (``link.call``: negotiation and cycle, measured over the same link by
    :func:`hvdlab.bench.link_encode.call_seconds`) and the ring's messages, plus the ring of the codec's bytes and
    their reduction. ``link``: the link fitted over the link (:func:`hvdlab.costmodel.fit_link`: alpha and beta from
    all-reduces timed over it, gamma the workers' measured add; ``benchmarks/link.py``); ``link_bps``, one TCP
    stream's rate, is reported beside it. On n = 2 ranks a ring all-reduce and an all-gather both send each rank's
    buffer once, so the codec's bytes are what crosses the link (an all-gather adds nothing up: its reduction term
    over-counts by the add, < 1 % at these rates).
    """
    history = result["history"]
    steady = history[1:] or history
    step = statistics.fmean(h["step_seconds_max_rank"] for h in steady)
    phases = result["phase_seconds"]
    # Local SGD averages inside the optimizer's step (the "update" phase), not in sync_wait.
    waiting = ("sync_wait",) if result["config"]["sync"]["mode"] == "allreduce" else ("sync_wait", "update")
    sync_share = sum(phases.get(k, 0.0) for k in waiting) / (sum(phases.values()) or 1.0)
    steps = max(1, result["optimizer_steps"])
    wire = result["wire"]["bytes"] / steps
    link_bytes = (result.get("link_bytes") or {}).get("sent", 0) / steps
    compute = step * (1 - sync_share)
    calls = calls_per_step(result["config"])
    # The codec's kernels as training ran them (PyTorch's adapter times them: WireCounter.codec_seconds; on the
    # loopback probe 2-3x the same kernels timed alone), else as timed alone before training.
    in_situ = result["wire"].get("codec_seconds", 0.0) / steps
    codec_s = in_situ if in_situ > 0 and encode_s > 0 else encode_s
    messages = 2 * (n - 1) * link.alpha   # one ring's messages: paid once per call, as the call itself is
    predicted = compute + codec_s + calls * (link.call + messages) + costmodel.ring_time(wire, n, link) - messages
    return {"rate": rate, "framework": result["config"]["train"]["framework"], "compression": label(result["config"]),
            "numel": result["numel"], "steps": steps, "wire_bytes_per_step": wire, "link_bytes_per_step": link_bytes,
            "link_over_wire": link_bytes / wire if wire else None, "step_ms": 1e3 * step, "sync_share": sync_share,
            "compute_ms": 1e3 * compute, "encode_ms": 1e3 * encode_s, "in_situ_ms": 1e3 * in_situ if in_situ else None,
            "link_MBps": link_bps / 1e6,
            "predicted_ms": 1e3 * predicted, "calls_per_step": calls, "call_ms": 1e3 * link.call,
            "accuracy": result["test_accuracy"],
            "ranks_identical": result["param_spread"] == 0.0}


COSTMODEL_BAND = (0.8, 1.25)  # the issue's target: predicted / measured within it for >= 90 % of configurations


def costmodel_fit(rows: list[dict], band: tuple[float, float] = COSTMODEL_BAND) -> list[dict]:
    """Per rate and framework: how many of the predicted rows (hvdsync's runs; the medians of
    :func:`aggregate`) the cost model predicts within ``band``, and which fall outside, with their ratio."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        if r.get("predicted_ms") and r.get("step_ms"):
            groups.setdefault((r["rate"], r["framework"]), []).append(r)
    out = []
    for (rate, framework), rs in groups.items():
        ratios = [(r["compression"], r["predicted_ms"] / r["step_ms"]) for r in rs]
        outside = [{"run": run, "ratio": x} for run, x in ratios if not band[0] <= x <= band[1]]
        within = len(ratios) - len(outside)
        out.append({"rate": rate, "framework": framework, "configs": len(ratios), "within": within,
                    "share": within / len(ratios), "low": band[0], "high": band[1], "outside": outside})
    return out


def ddp_row(result: dict, rate: str) -> dict:
    """One DDP run (:func:`hvdlab.bench.link_ddp.fit`); its link bytes are node1's counters over the run per step.
    No prediction: DDP overlaps its all-reduce with the backward pass, and its split of a step is not measured."""
    steps = max(1, result["steps"])
    link_bytes = result["link_bytes"]
    return {"rate": rate, "framework": "torch", "compression": result["compression"], "numel": result["numel"],
            "steps": steps, "wire_bytes_per_step": None, "link_bytes_per_step": link_bytes / steps,
            "link_over_wire": None, "step_ms": 1e3 * result["step_s"], "sync_share": None, "compute_ms": None,
            "encode_ms": None, "link_MBps": None, "predicted_ms": None, "accuracy": result["accuracy"],
            "ranks_identical": None}


def _f(value, spec: str, width: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}{spec}}"


def _range(spread) -> str:
    return f"{spread[0]:.1f}-{spread[1]:.1f}" if spread else "-"


def table(rows: list[dict]) -> str:
    """The sweep's table (rows of :func:`aggregate`: medians of the repeats, ``min-max`` the step's range);
    ``x none`` is the ratio to hvdsync's ``none`` at the same rate and framework; ``accuracy`` the mean over the
    row's seeds."""
    lines = [f"{'rate':<8} {'framework':<10} {'run':<15} {'link B/step':>12} {'link/wire':>9} {'step ms':>8} "
             f"{'min-max':>13} {'x none':>7} {'sync %':>7} {'encode ms':>9} {'in situ':>7} {'model ms':>9} "
             f"{'pred/meas':>9} {'accuracy':>9}"]
    for r in rows:
        base = next((b for b in rows if b["compression"] == "none" and b["rate"] == r["rate"]
                     and b["framework"] == r["framework"]), None)
        r["time_ratio"] = r["step_ms"] / base["step_ms"] if base else None
        r["pred_over_meas"] = r["predicted_ms"] / r["step_ms"] if r["predicted_ms"] else None
        lines.append(f"{r['rate']:<8} {r['framework']:<10} {r['compression']:<15} {r['link_bytes_per_step']:>12,.0f} "
                     f"{_f(r['link_over_wire'], '.3f', 9)} {r['step_ms']:>8.1f} {_range(r.get('step_spread')):>13} "
                     f"{_f(r['time_ratio'], '.2f', 7)} "
                     f"{_f(r['sync_share'] and 100 * r['sync_share'], '.1f', 7)} {_f(r['encode_ms'], '.1f', 9)} "
                     f"{_f(r.get('in_situ_ms'), '.1f', 7)} {_f(r['predicted_ms'], '.1f', 9)} {_f(r['pred_over_meas'], '.2f', 9)} "
                     f"{r['accuracy']:>9.4f}")
    return "\n".join(lines)


PEERS = {"none": "ddp", "fp16": "ddp-fp16", "powersgd:2": "ddp-powersgd:2",
         "powersgd:4": "ddp-powersgd:4"}
# What a repeated row keeps as the median of its repeats (the rest: the first repeat's, which do not vary).
MEDIANS = ("link_bytes_per_step", "step_ms", "sync_share", "compute_ms", "encode_ms", "in_situ_ms", "predicted_ms",
           "link_over_wire", "wire_bytes_per_step")


def _key(r: dict) -> tuple:
    return r["rate"], r["framework"], r["compression"]


def aggregate(rows: list[dict]) -> list[dict]:
    """One row per rate, framework and run from its repeats (rows with ``repeat``): the median of each timed figure,
    ``step_spread`` ([min, max] of the step time), ``repeats``, and the accuracies of every seed."""
    out = []
    for reps in _groups(rows).values():
        row = dict(reps[0])
        for k in MEDIANS:
            values = [r[k] for r in reps if r.get(k) is not None]
            row[k] = statistics.median(values) if values else None
        steps = [r["step_ms"] for r in reps]
        row.update(repeats=len(reps), step_spread=[min(steps), max(steps)],
                   accuracy=statistics.fmean(r["accuracy"] for r in reps),
                   accuracies=[r["accuracy"] for r in reps], seeds=[r.get("seed") for r in reps])
        row.pop("repeat", None)
        row.pop("seed", None)
        out.append(row)
    return out


def versus_ddp(rows: list[dict]) -> list[dict]:
    """hvdsync's step time over DDP's with the matching hook, per rate, from the runs of each repeat (``rows``: one
    per run and repeat, both sides of a repeat on the same seed): ``ratio`` is the median of the repeats' ratios,
    ``spread`` their [min, max]; ``hvdsync_ms`` / ``ddp_ms`` the sides' median steps (target: ratio <= 1.0)."""
    out = []
    for (rate, framework, name), reps in _groups(rows).items():
        if framework != "torch" or name not in PEERS:
            continue
        peers = {r.get("repeat", 0): r for r in rows if r["compression"] == PEERS[name] and r["rate"] == rate}
        pairs = [(r, peers[r.get("repeat", 0)]) for r in reps if r.get("repeat", 0) in peers]
        if not pairs:
            continue
        ratios = [a["step_ms"] / b["step_ms"] for a, b in pairs]
        out.append({"rate": rate, "hvdsync": name, "ddp": PEERS[name], "ratio": statistics.median(ratios),
                    "repeats": len(pairs), "spread": [min(ratios), max(ratios)],
                    "hvdsync_ms": statistics.median(a["step_ms"] for a, _ in pairs),
                    "ddp_ms": statistics.median(b["step_ms"] for _, b in pairs),
                    "accuracy_delta": statistics.fmean(a["accuracy"] - b["accuracy"] for a, b in pairs)})
    return out


def _groups(rows: list[dict]) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(_key(r), []).append(r)
    return groups


def accuracy_summary(rows: list[dict]) -> list[dict]:
    """Per framework and run: test accuracy over every seed it trained with (every repeat at every rate has its own;
    the rate does not change what is computed), as :func:`hvdlab.bench.link_fair.accuracy_stats`, and its
    difference to hvdsync's ``none`` on the same seeds (mean, standard deviation)."""
    from hvdlab.bench.link_fair import accuracy_stats

    by_run: dict[tuple, dict] = {}
    for r in rows:
        by_run.setdefault((r["framework"], r["compression"]), {})[r.get("seed")] = r
    out = []
    for (framework, name), seeds in by_run.items():
        base = by_run.get((framework, "none"), {})
        stats = accuracy_stats([r["accuracy"] for r in seeds.values()],
                               next(iter(seeds.values())).get("test_samples") or 0)
        deltas = [r["accuracy"] - base[s]["accuracy"] for s, r in seeds.items() if s in base]
        out.append({"framework": framework, "run": name, **stats,
                    "delta_vs_none": statistics.fmean(deltas) if deltas else None,
                    "delta_sd": statistics.stdev(deltas) if len(deltas) > 1 else None})
    return out


def scaling_row(two: dict, four: dict, link_bps: float) -> dict:
    """4 workers on 2 hosts against 2 on 1 at the same per-worker batch: efficiency = per-worker throughput of the
    4 over that of the 2 (their step-time ratio), and the cost model's bound: the 2-worker step over the
    4-worker step it predicts, the 4's compute plus a ring of 4 ranks whose 2 cross-host edges each carry
    2 (n-1)/n S = 1.5 S over one link direction."""
    s2, s4 = (statistics.fmean(h["step_seconds_max_rank"] for h in (r["history"][1:] or r["history"])) for r in (two, four))
    share = four["phase_seconds"].get("sync_wait", 0.0) / (sum(four["phase_seconds"].values()) or 1.0)
    wire = four["wire"]["bytes"] / max(1, four["optimizer_steps"])
    predicted = costmodel.step_time(s4 * (1 - share), wire, 4, costmodel.Link(ALPHA_S, 1 / link_bps))
    return {"compression": label(four["config"]), "step2_ms": 1e3 * s2, "step4_ms": 1e3 * s4,
            "efficiency": s2 / s4, "predicted4_ms": 1e3 * predicted, "bound": s2 / predicted,
            "accuracy2": two["test_accuracy"], "accuracy4": four["test_accuracy"]}
