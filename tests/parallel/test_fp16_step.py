"""``benchmarks/step.py fp16 --quick``: every contender runs in the same two workers and the run checks them.

No timing is asserted (the machine is shared; the figures are in benchmarks/results/step/). The run itself fails when a
contender's parameters differ between the ranks or an fp16 contender strays from fp32's, so exit status 0 and a
full table mean every contender trained correctly.
"""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_quick_run_has_every_contender_and_checks_their_parameters():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "step.py"), "fp16", "--quick"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in proc.stdout.splitlines()
            if line.startswith("| ") and not line.startswith("| contender")}
    assert set(rows) == {"fp32", "fp16", "fp16, allocating hook (before)", "fp32, sleeping wait",
                         "fp16, sleeping wait", "fp16, allocating hook, sleeping wait", "compute only"}
    for name, cells in rows.items():
        assert float(cells[1]) > 0, name                                   # a step time was measured
    assert rows["fp32"][2] == "1.00" and rows["compute only"][2] == "-"
    assert "parameters equal on both ranks for every contender" in proc.stdout
