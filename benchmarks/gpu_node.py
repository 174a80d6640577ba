"""benchmarks/gpu.sh's helpers that are easier in Python than in bash: the carry bundle's manifest, the preflight on
the GPU node, which carried wheels the node lacks, and the run's record. Standard library only: it runs under the
node's own interpreter before anything is installed, and never imports torch (seconds, not a CUDA start-up).

    python benchmarks/gpu_node.py manifest DIR --for-python 3.12 --mlflow on|off --why TEXT
    python benchmarks/gpu_node.py preflight --work DIR --out DIR [--bundle DIR]   # KEY=VALUE lines, or one error line
    python benchmarks/gpu_node.py lacking DIR                                      # the bundle's wheels to install
    python benchmarks/gpu_node.py prune DIR --node-has FILE                        # drop wheels the node has
    python benchmarks/gpu_node.py record OUT/record.json KEY=FILE_OR_VALUE ...
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

MANIFEST = "MANIFEST.json"
HOROVOD_SDIST = "horovod-0.28.1.tar.gz"
HEADERS = "python-include"  # the bundle's copy of CPython's headers, for a node whose Python has none
FREE_GIB = 4  # Horovod's NCCL build tree and its cache: about 1.5 GiB measured; twice that and room for the rest


class Refused(Exception):
    """One line saying what was found and what is needed; the preflight stops with it."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _tag(version: str) -> str:
    major, minor = version.split(".")[:2]
    return f"cp{major}{minor}"


def headers_version(folder: Path) -> str | None:
    """X.Y of the CPython headers in folder (their patchlevel.h), or None where there are none."""
    level = folder / "patchlevel.h"
    if not (folder / "Python.h").is_file() or not level.is_file():
        return None
    found = dict(re.findall(r"#define\s+PY_(MAJOR|MINOR)_VERSION\s+(\d+)", level.read_text()))
    return f"{found.get('MAJOR')}.{found.get('MINOR')}" if len(found) == 2 else None


# ---- the bundle ----------------------------------------------------------------------------------------------------
def manifest(folder: Path, for_python: str, mlflow: str, why: str, budget_mib: float) -> dict:
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)
    entries = [{"file": str(p.relative_to(folder)), "bytes": p.stat().st_size, "sha256": _sha256(p)} for p in files]
    total = sum(e["bytes"] for e in entries)
    m = {"for_python": for_python, "python_tag": _tag(for_python), "platform": "linux_x86_64",
         "made": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
         "horovod_sdist": HOROVOD_SDIST if (folder / HOROVOD_SDIST).exists() else None,
         "tracking": {"mlflow": mlflow == "on", "why": why}, "bytes": total, "budget_mib": budget_mib,
         "files": entries}
    if total > budget_mib * 2**20:
        raise Refused(f"the bundle in {folder} holds {total / 2**20:.1f} MiB, over the {budget_mib:g} MiB that can "
                      f"be carried")
    (folder / MANIFEST).write_text(json.dumps(m, indent=1) + "\n")
    return m


def check_bundle(folder: Path) -> dict:
    """The manifest, every file's checksum, and the Python it was made for against this one."""
    path = folder / MANIFEST
    if not path.is_file():
        raise Refused(f"--bundle {folder}: no {MANIFEST} there (made by: bash benchmarks/gpu.sh --prepare DIR "
                      f"--for-python {sys.version_info.major}.{sys.version_info.minor})")
    m = json.loads(path.read_text())
    here = _tag(f"{sys.version_info.major}.{sys.version_info.minor}")
    if m["python_tag"] != here:
        raise Refused(f"--bundle {folder} was made for Python {m['for_python']} ({m['python_tag']} wheels) but this "
                      f"node's {sys.executable} is Python {platform_version()} ({here}); make it with --prepare DIR "
                      f"--for-python {sys.version_info.major}.{sys.version_info.minor}")
    for e in m["files"]:
        f = folder / e["file"]
        if not f.is_file() or f.stat().st_size != e["bytes"] or _sha256(f) != e["sha256"]:
            raise Refused(f"--bundle {folder}: {e['file']} is missing or differs from its manifest (sha256 "
                          f"{e['sha256'][:12]}...); copy the bundle again")
    return m


def platform_version() -> str:
    return ".".join(map(str, sys.version_info[:3]))


def lacking(folder: Path) -> list[str]:
    """The bundle's wheels whose distribution this environment does not have: the node's own stay as they are."""
    out = []
    for wheel in sorted((folder / "wheels").glob("*.whl")):
        dist = wheel.name.split("-")[0]
        try:
            metadata.version(dist)
        except metadata.PackageNotFoundError:
            out.append(str(wheel))
    return out


def _norm(name: str) -> str:
    # PEP 503's normal form; a wheel's file name spells its distribution with underscores (scikit_learn-1.9.1-...).
    return re.sub(r"[-_.]+", "-", name).lower()


def prune(folder: Path, node_has: Path) -> list[str]:
    """Delete the bundle's wheels whose distribution the node already has (FILE: the node's `pip list --format=freeze`
    or one name a line), so the node's own copy serves and the bundle stays small; `lacking` would skip them there."""
    have = set()
    for line in node_has.read_text().splitlines():
        name = re.split(r"[=<>!~ @;\[]", line.strip(), maxsplit=1)[0]
        if name and not name.startswith("#"):
            have.add(_norm(name))
    gone = []
    for wheel in sorted((folder / "wheels").glob("*.whl")):
        if _norm(wheel.name.split("-")[0]) in have:
            wheel.unlink()
            gone.append(wheel.name)
    return gone


# ---- the preflight -------------------------------------------------------------------------------------------------
def _run(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def _where(name: str) -> str:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return ""
    return list(spec.submodule_search_locations)[0] if spec and spec.submodule_search_locations else ""


def torch_facts() -> tuple[str, str]:
    """torch's version and the CUDA it is built for, from its files (as scripts/build_horovod.sh reads them)."""
    where = _where("torch")
    if not where:
        raise Refused(f"{sys.executable} has no torch: --python names the node's CUDA torch environment")
    try:
        version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        version = "?"
    text = Path(where, "version.py").read_text() if Path(where, "version.py").is_file() else ""
    m = re.search(r"^cuda(?:: [^=]+)? = '([0-9.]+)'", text, re.M)
    if not m:
        raise Refused(f"torch {version} in {sys.executable}'s environment is a CPU build: the GPU run needs its "
                      f"CUDA build")
    return version, m.group(1)


def nvcc_facts(torch_cuda: str) -> tuple[str, str]:
    """The CUDA compiler Horovod's build will take (scripts/build_horovod.sh's order) and its version."""
    home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    wheel = Path(_where("nvidia") or "/nonexistent", f"cu{torch_cuda.split('.')[0]}", "bin", "nvcc")
    found = [c for c in (shutil.which("nvcc"), os.path.join(home, "bin", "nvcc"), str(wheel))
             if c and os.access(c, os.X_OK)]
    if not found:
        raise Refused(f"no CUDA compiler: no nvcc on PATH, in $CUDA_HOME ({home}) or in the environment's "
                      f"nvidia-cuda-nvcc wheel; the Horovod build needs CUDA {torch_cuda.split('.')[0]}'s nvcc")
    m = re.search(r"release ([0-9.]+)", _run([found[0], "--version"]))
    if not m:
        raise Refused(f"{found[0]} --version names no CUDA release")
    return found[0], m.group(1)


def driver_facts() -> dict:
    """What nvidia-smi says: GPUs, their name and compute capability, the driver and the newest CUDA it supports."""
    if not shutil.which("nvidia-smi"):
        raise Refused("no nvidia-smi on PATH (no NVIDIA driver): run this on the GPU node")
    rows = [r.split(",") for r in _run(["nvidia-smi", "--query-gpu=name,driver_version,compute_cap",
                                        "--format=csv,noheader"]).strip().splitlines() if r.strip()]
    if not rows:
        raise Refused("nvidia-smi lists no GPU")
    m = re.search(r"CUDA Version:\s*([0-9.]+)", _run(["nvidia-smi"]))
    return {"GPUS": str(len(rows)), "GPU_NAME": rows[0][0].strip(), "DRIVER": rows[0][1].strip(),
            "CC": rows[0][2].strip().replace(".", ""), "DRIVER_CUDA": m.group(1) if m else ""}


def _writable(folder: Path, what: str) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / ".gpu-sh-probe"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise Refused(f"{what} {folder} is not writable ({e.strerror})") from None


def python_headers(bundle: Path | None) -> str:
    """Where Horovod's build finds Python.h: "node" (the interpreter's own include folder), else the bundle's carried
    copy of the same X.Y. A node's Python often comes without them (Debian's and Ubuntu's python3.X-dev is a package
    of its own), and the torch extension includes Python.h: a refusal here saves the build's minute."""
    import sysconfig
    own = Path(sysconfig.get_paths()["include"])
    if (own / "Python.h").is_file():
        return "node"
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    carried = bundle / HEADERS if bundle is not None else None
    if carried is not None and headers_version(carried) == here:
        return str(carried)
    raise Refused(f"{sys.executable} (Python {platform_version()}) has no development headers (no Python.h in {own}), "
                  f"which Horovod's torch extension is compiled against: install python{here}-dev there, or carry "
                  f"CPython {here}'s headers: bash benchmarks/gpu.sh --prepare DIR --for-python {here} "
                  f"--python-headers INCLUDE_DIR" + (f" (the bundle's {HEADERS} is Python "
                  f"{headers_version(carried)})" if carried is not None and carried.is_dir() else ""))


def preflight(work: Path, out: Path, bundle: Path | None) -> dict:
    facts: dict = {"PYTHON": sys.executable, "PYTHON_VERSION": platform_version(),
                   "PYTAG": _tag(platform_version())}
    missing = [t for t in ("patch", "make", "c++") if not shutil.which(t)]
    if not (shutil.which("cmake") or os.environ.get("HOROVOD_CMAKE")):
        missing.append("cmake")
    if missing:
        raise Refused(f"not on PATH: {', '.join(missing)}; Horovod is built from source and needs a C++ compiler, "
                      f"make, patch and CMake")
    if not importlib.util.find_spec("pip"):
        raise Refused(f"{sys.executable} has no pip: the carried wheels and the Horovod build are installed with it")
    facts["TORCH"], facts["TORCH_CUDA"] = torch_facts()
    facts["PY_HEADERS"] = python_headers(bundle)
    facts["NVCC"], facts["NVCC_CUDA"] = nvcc_facts(facts["TORCH_CUDA"])
    facts.update(driver_facts())
    major = facts["TORCH_CUDA"].split(".")[0]
    if facts["NVCC_CUDA"].split(".")[0] != major:
        raise Refused(f"torch {facts['TORCH']} is built for CUDA {facts['TORCH_CUDA']} but {facts['NVCC']} is CUDA "
                      f"{facts['NVCC_CUDA']}: Horovod's NCCL ops must be compiled for torch's CUDA major ({major}); "
                      f"put CUDA {major}'s nvcc first on PATH or set CUDA_HOME")
    if not facts["DRIVER_CUDA"] or int(facts["DRIVER_CUDA"].split(".")[0]) < int(major):
        raise Refused(f"torch {facts['TORCH']} is built for CUDA {facts['TORCH_CUDA']} but driver "
                      f"{facts['DRIVER']} supports CUDA {facts['DRIVER_CUDA'] or '(not said by nvidia-smi)'}: a CUDA "
                      f"{major} driver is needed")
    nccl = Path(os.environ.get("HOROVOD_NCCL_HOME") or Path(_where("nvidia") or "/nonexistent", "nccl"))
    if not (nccl / "include" / "nccl.h").is_file() and not Path("/usr/include/nccl.h").is_file():
        raise Refused(f"no NCCL: no nvidia-nccl-cu{major} wheel in {sys.executable}'s environment, no "
                      f"$HOROVOD_NCCL_HOME, no /usr/include/nccl.h")
    _writable(work, "the work folder")
    _writable(out, "the results folder")
    free = shutil.disk_usage(work).free / 2**30
    if free < FREE_GIB:
        raise Refused(f"{free:.1f} GiB free under {work}; the Horovod build needs {FREE_GIB} GiB (--work DIR)")
    facts["FREE_GIB"] = f"{free:.0f}"
    if bundle is not None:
        m = check_bundle(bundle)
        facts["BUNDLE_MIB"] = f"{m['bytes'] / 2**20:.1f}"
        facts["BUNDLE_SDIST"] = "yes" if m["horovod_sdist"] else "no"
        facts["BUNDLE_MLFLOW"] = "on" if m["tracking"]["mlflow"] else "off"
        facts["BUNDLE_TRACKING_WHY"] = m["tracking"]["why"]
    return facts


# ---- the record ----------------------------------------------------------------------------------------------------
def record(path: Path, items: list[str]) -> None:
    """record.json: each KEY=VALUE, where VALUE naming a file is that file's content (JSON parsed; KEY=VALUE lines
    as a dict; other text as its lines)."""
    rec: dict = json.loads(path.read_text()) if path.is_file() else {}
    for item in items:
        key, _, value = item.partition("=")
        p = Path(value)
        if value and p.is_file():
            text = p.read_text(errors="replace")
            try:
                rec[key] = json.loads(text)
            except ValueError:
                lines = text.splitlines()
                pairs = [line.partition("=") for line in lines]
                rec[key] = ({k: v for k, _, v in pairs} if lines and all(re.fullmatch(r"[A-Za-z_0-9-]+", k) and s
                                                                           for k, s, _ in pairs) else lines)
        else:
            rec[key] = value
    path.write_text(json.dumps(rec, indent=1) + "\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="gpu_node.py")
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("manifest")
    m.add_argument("folder", type=Path)
    m.add_argument("--for-python", required=True)
    m.add_argument("--mlflow", choices=["on", "off"], required=True)
    m.add_argument("--why", default="")
    m.add_argument("--budget-mib", type=float, default=64)
    f = sub.add_parser("preflight")
    f.add_argument("--work", type=Path, required=True)
    f.add_argument("--out", type=Path, required=True)
    f.add_argument("--bundle", type=Path)
    lk = sub.add_parser("lacking")
    lk.add_argument("folder", type=Path)
    pr = sub.add_parser("prune")
    pr.add_argument("folder", type=Path)
    pr.add_argument("--node-has", type=Path, required=True)
    r = sub.add_parser("record")
    r.add_argument("path", type=Path)
    r.add_argument("items", nargs="*")
    a = p.parse_args(argv)
    try:
        if a.cmd == "manifest":
            got = manifest(a.folder, a.for_python, a.mlflow, a.why, a.budget_mib)
            print(f"{len(got['files'])} files, {got['bytes'] / 2**20:.1f} MiB, for {got['python_tag']}")
        elif a.cmd == "preflight":
            for k, v in preflight(a.work, a.out, a.bundle).items():
                print(f"{k}={v}")
        elif a.cmd == "lacking":
            print("\n".join(lacking(a.folder)))
        elif a.cmd == "prune":
            gone = prune(a.folder, a.node_has)
            print(f"{len(gone)} wheel(s) the node has left out" + (f": {', '.join(gone)}" if gone else ""))
        else:
            record(a.path, a.items)
    except Refused as e:
        print(f"[gpu] error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
