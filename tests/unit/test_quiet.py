"""hvdsync.launch.quiet: absl start-up records are dropped from file descriptor 2, everything else gets through.

The lines below are TensorFlow 2.21's, as it writes them at import on an AVX-512 CPU (oneDNN on). The end-to-end
check with TensorFlow itself (forced to print them on any CPU) is in tests/parallel/test_tensorflow.py.
"""
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hvdsync.launch.quiet import keep

REPO = Path(__file__).resolve().parents[2]

ONEDNN = (b"I0000 00:00:1796047963.214361    6211 port.cc:153] oneDNN custom operations are on. You may see slightly "
          b"different numerical results due to floating-point round-off errors from different computation orders. "
          b"To turn them off, set the environment variable `TF_ENABLE_ONEDNN_OPTS=0`.")
NOTICE = b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
FEATURES = (b"To enable the following instructions: AVX2 AVX512F AVX512_VNNI AVX512_BF16 FMA, in other operations, "
            b"rebuild TensorFlow with the appropriate compiler flags.")
WARNING = b"W0000 00:00:1796047963.3 6211 cuda_executor.cc:1228] could not open file to read NUMA node"
ERROR = b"E1130 14:12:01.123456    6211 gloo_context.cc:12] Connect timeout"


@pytest.mark.parametrize("level, kept", [
    (0, [ONEDNN, NOTICE, FEATURES, WARNING, ERROR]),
    (1, [WARNING, ERROR]),
    (2, [ERROR]),
    (3, []),
])
def test_records_below_the_level_and_their_notices_are_dropped(level, kept):
    lines = [ONEDNN, NOTICE, FEATURES, WARNING, ERROR]
    assert [line for line in lines if keep(line, level)] == kept


@pytest.mark.parametrize("line", [b"Traceback (most recent call last):", b"hvdsync: error: sync.op: ...", b"",
                                  b"I0000 is not a record", b"  File \"x.py\", line 3, in <module>"])
def test_other_lines_always_get_through(line):
    assert keep(line, 3)


def test_the_first_import_of_a_watched_module_is_filtered_at_the_file_descriptor(tmp_path):
    # A module that writes to fd 2 from "native" code at import (os.write bypasses sys.stderr, as C++ does).
    start, end = NOTICE + b"\n" + ONEDNN + b"\n", ERROR + b"\npartial line without newline"
    (tmp_path / "noisy.py").write_text(textwrap.dedent(f"""
        import os, sys
        os.write(2, {start!r})
        print("a python warning", file=sys.stderr)
        os.write(2, {end!r})
        VALUE = 42
    """))
    code = textwrap.dedent("""
        import os, sys
        from hvdsync.launch.quiet import quiet_imports
        quiet_imports(("noisy",))
        quiet_imports(("noisy",))  # idempotent
        import noisy
        os.write(2, b"\\nafter\\n")
        print(noisy.VALUE, type(noisy.__loader__).__name__)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, cwd=tmp_path, check=True,
                          env={"PYTHONPATH": f"{tmp_path}:{REPO}"})
    assert proc.stdout.split() == [b"42", b"SourceFileLoader"]  # the real module, its own loader
    assert proc.stderr == b"a python warning\n" + ERROR + b"\npartial line without newline\nafter\n"
