"""The three tables of ``training.py`` (step time, scaling, knobs) as text and as markdown, and the targets."""
from __future__ import annotations

PEERS = {"torch": "ddp", "tensorflow": "mwms"}
# The targets, as (what, contender, versus, limit): a ratio of medians must stay <= limit.
TARGETS = [("hvdsync fit <= 1.03x raw Horovod", "fit", "raw", 1.03),
           ("hvdsync adapter API <= 1.03x raw Horovod", "api", "raw", 1.03),
           ("hvdsync fit <= 1.0x {peer}", "fit", "peer", 1.0),
           ("hvdsync adapter API <= 1.0x {peer}", "api", "peer", 1.0),
           ("fp16 step time <= 0.75x fp32 (MLP)", "fp16", "api", 0.75)]


def _cells(headers: list[str], rows: list[list[str]]) -> tuple[str, str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    text = ["  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(headers, widths)))]
    text.append("-" * len(text[0]))
    text += ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    md = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    md += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(text), "\n".join(md)


def _ratio(r: dict | None) -> str:
    return f"{r['ratio']:.3f} ({r['per_rep'][0]:.2f}-{r['per_rep'][1]:.2f})" if r else "-"


def _verdict(row: dict) -> str:
    if not row.get("checked"):
        return "not run"
    text = f"{row['relative_error']:.1e}"
    return text + (" ok" if row["correct"] else " WRONG")


def _ms(row: dict, key: str = "median_ms") -> str:
    return f"{row[key]:.1f}" if key in row else "-"


def step_table(block: dict) -> tuple[str, str]:
    rows, ratios, peer = block["rows"], block["ratios"], PEERS[block["framework"]]
    out = []
    for name, row in rows.items():
        if row.get("group", "step") != "step":
            continue
        if "median_ms" not in row:
            out.append([row["label"], "failed: " + row.get("error", "").splitlines()[-1][:60] if row.get("error")
                        else "failed", "-", "-", "-", "-", "-", _verdict(row)])
            continue
        out.append([row["label"], _ms(row), _ms(row, "p10_ms"), _ms(row, "p90_ms"), f"{row['samples_per_s']:.0f}",
                    _ratio(ratios.get(f"{name}/raw")), _ratio(ratios.get(f"{name}/{peer}")), _verdict(row)])
    return _cells(["contender", "median ms", "p10", "p90", "samples/s", "/ raw Horovod (per rep)",
                   f"/ {peer} (per rep)", "params vs 1 process"], out)


def scaling_table(block: dict) -> tuple[str, str]:
    rows, s = block["rows"], block["scaling"]
    out = []
    for name in ("single", "single_2t", "api"):
        row = rows.get(name, {})
        if "median_ms" not in row:
            continue
        sp = s["speedup"].get(name)
        out.append([row["label"] + (" (2 workers x 1 thread)" if name == "api" else ""), _ms(row),
                    f"{row['samples_per_s']:.0f}", f"{sp:.2f}" if sp else "-",
                    f"{sp / (2 if name != 'single' else 1):.2f}" if sp else "-"])
    if s.get("predicted_ms"):
        out.append([f"cost model: 2 workers = half the 1-thread step + ring all-reduce of {s['model_mb']:.1f} MB",
                    f"{s['predicted_ms']:.1f}", "-", f"{s['predicted_speedup']:.2f}",
                    f"{s['predicted_speedup'] / 2:.2f}"])
    return _cells(["run", "step ms", "samples/s", "speedup vs 1 thread", "efficiency (per core)"], out)


def knobs_table(block: dict) -> tuple[str, str]:
    rows, ratios = block["rows"], block["ratios"]
    out = []
    for name, row in rows.items():
        if name != "api" and row.get("group") != "knobs":
            continue
        b = row.get("bytes_per_step")
        r = row.get("allreduce_rounds_per_step")
        out.append([("hvdsync defaults" if name == "api" else row["label"]), _ms(row),
                    _ratio(ratios.get(f"{name}/{row.get('versus') or 'api'}")) if name != "api" else "1",
                    f"{b / 1e6:.1f}" if b else "-",
                    f"{r:.2f} / {row['backward_passes_per_step']}" if r is not None else "-", _verdict(row)])
    return _cells(["knob", "step ms", "/ defaults (per rep)", "MB to Horovod per step per rank",
                   "all-reduces / backward passes per step", "params vs 1 process"], out)


def targets(block: dict) -> list[dict]:
    """Where each target stands for this framework and model (only those whose rows ran)."""
    peer = PEERS[block["framework"]]
    out = []
    for what, name, base, limit in TARGETS:
        base = peer if base == "peer" else base
        r = block["ratios"].get(f"{name}/{base}")
        if name in block["rows"] and base in block["rows"]:
            out.append({"target": what.format(peer=block["rows"][base]["label"]), "ratio": r and r["ratio"],
                        "limit": limit, "met": bool(r and r["ratio"] <= limit)})
    return out


def render(doc: dict) -> tuple[str, str]:
    """All tables of a run: (text for the terminal, markdown)."""
    text, md = [], [f"Command: `{doc['command']}`; {doc['machine']['cpus']} CPUs, load average at start "
                    f"{doc['machine']['load']}, at end {doc['load_at_end']}.", ""]
    for key, block in doc["blocks"].items():
        w = block["work"]
        what = (f"{key}: {block['numel']:,} parameters, global batch {w['global_batch']} (2 x "
                f"{w['global_batch'] // 2}), {w['steps']} timed steps after {w['warmup']} per start, "
                f"{doc['reps']} repetitions")
        for title, fn in (("step time", step_table), ("scaling", scaling_table), ("knobs", knobs_table)):
            if title == "knobs" and not any(r.get("group") == "knobs" for r in block["rows"].values()):
                continue
            t, m = fn(block)
            text += [f"\n{title} -- {what}", t]
            md += [f"#### {title}: {what}", "", m, ""]
        for t in block["targets"]:
            line = (f"target {t['target']}: " + (f"{t['ratio']:.3f}" if t["ratio"] else "no ratio") +
                    (" met" if t["met"] else " NOT met"))
            text.append(line)
            md.append(f"- {line}")
        md.append("")
    return "\n".join(text), "\n".join(md)
