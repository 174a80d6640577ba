"""Statistics and printing for the benchmarks: medians and ratios, the side-by-side table, Horovod timelines."""
from __future__ import annotations

import json
import math
import os
import statistics
from pathlib import Path

MB = 1024 * 1024


def percentile(xs: list[float], q: float) -> float:
    """Linearly interpolated percentile, ``q`` in [0, 100]."""
    s = sorted(xs)
    k = (len(s) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summarize(results: dict, baseline: str | None) -> dict:
    """Per variant and size: n, median/p10/p90 ms, algorithmic bandwidth (size / median time), ratio to baseline.

    ``ratio`` is median(variant) / median(baseline) over all timed iterations; ``ratio_rounds`` is [min, max] of the
    same ratio taken inside each round, which shows how far the machine's noise moved it.
    """
    summary: dict = {}
    for name, res in results.items():
        rows = {}
        for size in res["rounds"][0]:
            ts = [t for rnd in res["rounds"] for t in rnd[size]]
            med = statistics.median(ts)
            cpu = [c for rnd in res["cpu_rounds"] for c in rnd[size]]
            faults = [f for rnd in res.get("fault_rounds", []) for f in rnd[size]]
            rows[size] = {"n": len(ts), "median_ms": med * 1e3, "p10_ms": percentile(ts, 10) * 1e3,
                          "p90_ms": percentile(ts, 90) * 1e3, "algbw_gbs": float(size) * MB / med / 1e9,
                          "cpu_ms": statistics.median(cpu) * 1e3, "verified_iterations": res["checked"][size]}
            if faults:  # minor page faults per call, both ranks (4 KiB pages of fresh memory written)
                rows[size]["faults"] = statistics.median(faults)
        summary[name] = rows
    if baseline:
        for name, rows in summary.items():
            for size, row in rows.items():
                row["ratio"] = row["median_ms"] / summary[baseline][size]["median_ms"]
                per = [statistics.median(a[size]) / statistics.median(b[size])
                       for a, b in zip(results[name]["rounds"], results[baseline]["rounds"])]
                row["ratio_rounds"] = [min(per), max(per)]
    return summary


def check_finite(summary: dict) -> None:
    """Raise unless every time is a positive finite number."""
    for name, rows in summary.items():
        for size, row in rows.items():
            for k in ("median_ms", "p10_ms", "p90_ms"):
                if not (math.isfinite(row[k]) and row[k] > 0):
                    raise AssertionError(f"{name} {size} MB: {k} = {row[k]}")


def format_table(summary: dict, labels: dict[str, str], baseline_label: str = "torch") -> str:
    """Sizes as blocks, variants side by side inside each block."""
    w = max(len(s) for s in labels.values()) + 2
    head = (f"{'size':>9}  {'variant':<{w}}{'median ms':>10}{'p10':>9}{'p90':>9}{'algbw GB/s':>11}{'cpu ms':>9}"
            f"{'faults':>8}{'/' + baseline_label:>9}{'per round':>14}")
    lines = [head, "-" * len(head)]
    for size in next(iter(summary.values())):
        for i, (name, label) in enumerate(labels.items()):
            row = summary[name][size]
            ratio = f"{row['ratio']:.2f}" if "ratio" in row else ""
            rr = f"{row['ratio_rounds'][0]:.2f}-{row['ratio_rounds'][1]:.2f}" if "ratio_rounds" in row else ""
            faults = f"{row['faults']:.0f}" if "faults" in row else ""
            lines.append(f"{(size + ' MB') if i == 0 else '':>9}  {label:<{w}}{row['median_ms']:>10.2f}"
                         f"{row['p10_ms']:>9.2f}{row['p90_ms']:>9.2f}{row['algbw_gbs']:>11.3f}{row['cpu_ms']:>9.1f}"
                         f"{faults:>8}{ratio:>9}{rr:>14}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def timeline_ops(path: str | Path, tensor: str = "allreduce.bench") -> dict[float, list[dict[str, float]]]:
    """Read a Horovod timeline (rank 0 writes it when ``HOROVOD_TIMELINE`` is set) into the ops on ``tensor``.

    Returns ``{size in MiB: [{activity: ms, ...} per op, in order]}`` with the activities Horovod records for an
    allreduce: ``NEGOTIATE_ALLREDUCE`` (ranks agreeing it is ready), ``ALLREDUCE`` (the whole execution), inside it
    ``GLOO_ALLREDUCE`` (the Gloo ring) and, for fused responses, ``MEMCPY_IN/OUT_FUSION_BUFFER``.
    """
    text = Path(path).read_text().rstrip().rstrip(",")
    events = json.loads(text if text.endswith("]") else text + "]")  # Horovod leaves the array open
    rows = {e["pid"] for e in events
            if e.get("ph") == "M" and e.get("name") == "process_name" and e.get("args", {}).get("name") == tensor}
    stack: list[dict] = []
    op: dict[str, float] = {}
    out: dict[float, list[dict[str, float]]] = {}
    for e in events:
        if e.get("pid") not in rows:
            continue
        if e.get("ph") == "B":
            stack.append(e)
        elif e.get("ph") == "E" and stack:
            begin = stack.pop()
            op[begin["name"]] = (e["ts"] - begin["ts"]) / 1e3
            if begin["name"] == "ALLREDUCE":
                elements = math.prod(json.loads(e.get("args", {}).get("shape", "[0]")))
                out.setdefault(elements * 4 / MB, []).append(op)
                op = {}
    return out


def parse_sizes(text: str) -> list[float]:
    """``"1,16,64"`` -> ``[1.0, 16.0, 64.0]`` (MiB)."""
    try:
        sizes = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        sizes = []
    if not sizes or any(not math.isfinite(s) or s <= 0 for s in sizes):
        raise ValueError(f"--sizes: {text!r}: expected comma-separated positive MiB values, e.g. 1,16,64")
    return sizes


def machine() -> dict:
    """What the figures were measured on (they mean little without it)."""
    import platform

    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    # The OS, architecture and C library, not the kernel's build string (that names the host, not the software).
    libc = " ".join(platform.libc_ver()).strip()
    return {"cpus": os.cpu_count(), "platform": " ".join(x for x in (platform.system(), platform.machine(), libc) if x),
            "python": platform.python_version(),
            "loadavg_at_start": load, "load": " ".join(f"{x:.1f}" for x in load) if load else "n/a"}
