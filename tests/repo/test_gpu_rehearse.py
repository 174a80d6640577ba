"""``bash benchmarks/gpu.sh --rehearse``: the GPU run's phases here, without a GPU, against the stand-in node of
tests/gpu/rehearsal/stub_node.sh (stub nvidia-smi and nvcc, torch's CUDA build as files): the preflight, the env, the
build plan, the GPU tests collected and every one refused under HVDSYNC_REQUIRE_GPU=1, the record. Nothing is
compiled. Then the preflight's one-line refusals for the mismatches a node can have."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not (ROOT / ".venv/bin/python").exists(), reason="the rehearsal runs the GPU tests "
                                "with this checkout's .venv (make install)")


def _rehearse(tmp_path, *args, node=""):
    env = {**os.environ, "HOME": str(tmp_path), "TMPDIR": str(tmp_path), "HVDSYNC_REHEARSAL_NODE": node}
    env.pop("HVDSYNC_GPU_OUT", None)
    return subprocess.run(["bash", "benchmarks/gpu.sh", "--rehearse", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env=env)


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rehearsal")
    proc = _rehearse(tmp, "--out", str(tmp / "out"), "--work", str(tmp / "work"))
    return proc, tmp / "out"


def test_the_env_sees_the_nodes_packages_through_their_own_pth_files(rehearsal):
    # The node's site folders are added with site.addsitedir, so their .pth files run too: setuptools' distutils shim
    # is one, and Horovod's CMake asks distutils for Python.h's folder (without it, Python 3.12's build found none).
    pth = list((rehearsal[1].parent / "work" / "env").glob("lib/python3.*/site-packages/zz-node-packages.pth"))
    lines = pth[0].read_text().splitlines()
    assert lines and all(re.fullmatch(r"import site; site\.addsitedir\('.+-packages'\)", x) for x in lines), lines


def test_the_rehearsal_goes_through_every_phase_and_predicts_the_run(rehearsal):
    proc, out = rehearsal
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    last = proc.stdout.strip().splitlines()[-1]
    m = re.search(r"rehearsed in \d+ s: preflight \(stub node: 1 GPU\(s\), driver CUDA 13\.0, torch CUDA 13\.0, "
                  r"nvcc 13\.0\), env, plan \(cuda13\.0-nccl2\.27\.7-cc90\), build skipped, (\d+) GPU tests collected "
                  r"and (\d+) refused without a GPU, bench's command line, record \((\d) files\); bundle empty .*; the "
                  r"real run is predicted to take ~(\d+) min \((\d+) s; at most 570 s by its phase limits\)$", last)
    assert m, last
    collected, refused, files, minutes, seconds = map(int, m.groups())
    assert collected == refused >= 20 and files <= 8 and 0 < seconds <= 570 and minutes == (seconds + 59) // 60
    # Nothing compiled; the build it would have run is named, torch only with NCCL for the stub's compute capability.
    assert "building Horovod" not in proc.stdout + proc.stderr
    assert "build: not in a rehearsal (it would run: env PYTHON=" in proc.stdout


def test_the_rehearsals_record_holds_the_node_the_plan_and_the_timings(rehearsal):
    _, out = rehearsal
    files = sorted(p.name for p in out.iterdir())
    assert files == ["gpu.log", "nvidia-smi.txt", "record.json", "tests-gpu.txt", "tests-gpu.xml"], files
    rec = json.loads((out / "record.json").read_text())
    assert rec["node"]["DRIVER"] == "580.95.05" and rec["node"]["DRIVER_CUDA"] == "13.0"
    assert rec["node"]["TORCH"] == "2.11.0+cu130" and rec["node"]["CC"] == "90"
    plan = rec["plan"]
    assert (plan["FRAMEWORKS"], plan["GPU_OPERATIONS"], plan["MPI"], plan["SDIST"]) == ("torch", "NCCL", "none", "pypi")
    assert plan["KEY"].startswith("horovod0.28.1-cp") and "-torch2.11.0+cu130-cuda13.0-nccl2.27.7-cc90-" in plan["KEY"]
    assert set(rec["timings"]) == {"env", "plan", "tests"} and rec["failed"] == "" and rec["rehearsal"] == "yes"
    assert rec["tracking"].startswith("off: ") and rec["bundle"]["python_tag"] == f"cp{sys.version_info[0]}" \
        f"{sys.version_info[1]}"
    # Every GPU test failed in setup, naming why: none "passed" on a machine without a GPU.
    text = (out / "tests-gpu.txt").read_text()
    assert text.count("HVDSYNC_REQUIRE_GPU=1: this GPU test would have been skipped (no CUDA device visible") >= 20
    assert " passed" not in text.splitlines()[-1]


@pytest.mark.parametrize("node, line", [
    ("--driver-cuda 12.4", "torch 2.11.0+cu130 is built for CUDA 13.0 but driver 580.95.05 supports CUDA 12.4: a CUDA "
                           "13 driver is needed"),
    ("--nvcc 12.8", "torch 2.11.0+cu130 is built for CUDA 13.0 but {node}/bin/nvcc is CUDA 12.8: Horovod's NCCL ops "
                    "must be compiled for torch's CUDA major (13); put CUDA 13's nvcc first on PATH or set CUDA_HOME"),
    ("--torch-cuda cpu", "torch 2.11.0+cpu in {node}/node/bin/python's environment is a CPU build: the GPU run "
                         "needs its CUDA build"),
], ids=["driver", "nvcc", "cpu-torch"])
def test_the_preflight_refuses_a_mismatched_node_in_one_line(tmp_path, node, line):
    proc = _rehearse(tmp_path, "--out", str(tmp_path / "out"), node=node)
    where = re.search(r"preflight \((.*)/node/bin/python\)", proc.stdout).group(1)
    assert proc.returncode == 2 and proc.stderr == f"[gpu] error: {line.format(node=where)}\n", proc.stderr
    assert not (tmp_path / "out").exists()   # refused before anything was written


def test_the_preflight_refuses_a_bundle_made_for_another_python(tmp_path):
    bundle = tmp_path / "bundle"
    (bundle / "wheels").mkdir(parents=True)
    subprocess.run([sys.executable, "benchmarks/gpu_node.py", "manifest", str(bundle), "--for-python", "3.9",
                    "--mlflow", "off"], cwd=ROOT, check=True, capture_output=True)
    proc = _rehearse(tmp_path, "--bundle", str(bundle), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert re.fullmatch(r"\[gpu\] error: --bundle \S+ was made for Python 3\.9 \(cp39 wheels\) but this node's \S+ is "
                        r"Python (3\.\d+)\.\d+ \(cp3\d+\); make it with --prepare DIR --for-python \1\n", proc.stderr), proc.stderr


def _node(*args):
    return subprocess.run([sys.executable, "benchmarks/gpu_node.py", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)


def test_a_bundle_over_its_budget_is_refused_and_a_changed_file_is_found(tmp_path):
    bundle = tmp_path / "bundle"
    (bundle / "wheels").mkdir(parents=True)
    (bundle / "wheels" / "a-1.0-py3-none-any.whl").write_bytes(b"x" * 2**20)
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    proc = _node("manifest", str(bundle), "--for-python", here, "--mlflow", "off", "--budget-mib", "0.5")
    assert proc.returncode == 2 and proc.stderr == (f"[gpu] error: the bundle in {bundle} holds 1.0 MiB, over the "
                                                    f"0.5 MiB that can be carried\n"), proc.stderr
    assert _node("manifest", str(bundle), "--for-python", here, "--mlflow", "off").returncode == 0
    assert json.loads((bundle / "MANIFEST.json").read_text())["files"][0]["bytes"] == 2**20
    (bundle / "wheels" / "a-1.0-py3-none-any.whl").write_bytes(b"y" * 2**20)   # same size, other bytes
    proc = _node("preflight", "--work", str(tmp_path / "w"), "--out", str(tmp_path / "o"), "--bundle", str(bundle))
    # Without a GPU the preflight stops earlier (tools, torch, driver); the bundle's own check, asked directly:
    check = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, 'benchmarks'); import gpu_node\n"
                            f"try:\n gpu_node.check_bundle(__import__('pathlib').Path({str(bundle)!r}))\n"
                            "except gpu_node.Refused as e:\n print(e)"], cwd=ROOT, capture_output=True, text=True)
    assert check.stdout == (f"--bundle {bundle}: wheels/a-1.0-py3-none-any.whl is missing or differs from its "
                            f"manifest (sha256 {__import__('hashlib').sha256(b'x' * 2**20).hexdigest()[:12]}...); "
                            f"copy the bundle again\n"), check.stdout + check.stderr
    assert proc.returncode == 2 and proc.stderr.startswith("[gpu] error: ") and proc.stderr.count("\n") == 1


def _gpu_node():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import gpu_node
    finally:
        sys.path.pop(0)
    return gpu_node


def test_prepare_leaves_out_the_wheels_of_distributions_the_node_has(tmp_path):
    bundle = tmp_path / "bundle"
    (bundle / "wheels").mkdir(parents=True)
    for name in ("scikit_learn-1.9.1-cp312-cp312-manylinux_2_28_x86_64.whl", "PyYAML-6.0-cp312-none-any.whl",
                 "mlflow_skinny-3.17.2-py3-none-any.whl", "zope.interface-7.0-py3-none-any.whl"):
        (bundle / "wheels" / name).write_bytes(b"w")
    # The node's `pip list --format=freeze`, spelled as pip spells it (dashes, any case), and a plain name.
    (tmp_path / "freeze.txt").write_text("scikit-learn==1.8.0\npyyaml==6.0.2\n# a comment\nZope-Interface\n")
    proc = _node("prune", str(bundle), "--node-has", str(tmp_path / "freeze.txt"))
    assert proc.returncode == 0 and proc.stdout.startswith("3 wheel(s) the node has left out: "), proc.stdout
    assert sorted(p.name for p in (bundle / "wheels").iterdir()) == ["mlflow_skinny-3.17.2-py3-none-any.whl"]


def _headers(folder: Path, minor: int) -> Path:
    folder.mkdir(parents=True)
    (folder / "Python.h").write_text("/* */\n")
    (folder / "patchlevel.h").write_text(f"#define PY_MAJOR_VERSION        3\n#define PY_MINOR_VERSION        {minor}\n")
    return folder


def test_a_node_python_without_headers_takes_the_bundles_or_is_refused_in_one_line(tmp_path, monkeypatch):
    gpu_node = _gpu_node()
    import sysconfig
    bare = tmp_path / "include-of-a-python-without-its-dev-package"
    bare.mkdir()
    monkeypatch.setattr(sysconfig, "get_paths", lambda *a, **k: {"include": str(bare)})
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    with pytest.raises(gpu_node.Refused) as no_bundle:
        gpu_node.python_headers(None)
    assert str(no_bundle.value) == (
        f"{sys.executable} (Python {gpu_node.platform_version()}) has no development headers (no Python.h in {bare}), "
        f"which Horovod's torch extension is compiled against: install python{here}-dev there, or carry CPython "
        f"{here}'s headers: bash benchmarks/gpu.sh --prepare DIR --for-python {here} --python-headers INCLUDE_DIR")
    other = tmp_path / "other"
    _headers(other / gpu_node.HEADERS, sys.version_info.minor + 1)
    with pytest.raises(gpu_node.Refused, match=rf"\(the bundle's python-include is Python 3\.{sys.version_info.minor + 1}\)$"):
        gpu_node.python_headers(other)
    good = tmp_path / "good"
    carried = _headers(good / gpu_node.HEADERS, sys.version_info.minor)
    assert gpu_node.python_headers(good) == str(carried)
    (bare / "Python.h").write_text("")
    assert gpu_node.python_headers(good) == "node"   # the node's own, where it has them
