"""The ways in agree with each other: pins, Dockerfiles, CI, README."""
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile

import yaml
from packaging.requirements import Requirement

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _requirements():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        reqs += [r for r in extra if not r.startswith("hvdsync")]
    return [Requirement(r) for r in reqs]


def _constraint_pins():
    lines = [ln.split("#")[0].strip() for ln in (ROOT / "constraints.txt").read_text().splitlines()]
    return dict(ln.split("==") for ln in lines if ln)


def test_constraints_pin_every_dependency_exactly_within_the_supported_range():
    pins = _constraint_pins()
    assert all(re.fullmatch(r"[0-9][0-9A-Za-z.+]*", v) for v in pins.values()), pins
    reqs = _requirements()
    assert sorted({r.name for r in reqs}) == sorted(pins)                   # no dependency without a pin, and back
    for r in reqs:
        assert r.specifier and not any(s.operator == "==" for s in r.specifier), f"{r}: a range, not a pin"
        assert r.specifier.contains(pins[r.name], prereleases=True), f"{r.name}=={pins[r.name]} is outside {r}"


def test_install_script_installs_with_the_constraints_and_stamps_their_hash():
    install = (ROOT / "scripts" / "install.sh").read_text()
    assert re.search(r'pip install .*-c constraints\.txt -e "\.\[\$extras\]"', install)
    assert 'extras="${HVDSYNC_EXTRAS:-all}"' in install
    assert re.search(r"stamp=.*cat constraints\.txt", install)


def test_python_version_agrees_with_the_readme():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["requires-python"] == ">=3.11"
    assert "Needs Python 3.11" in (ROOT / "README.md").read_text()


def test_environment_yml_pins_agree_with_the_constraints():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    conda_pins = dict(p.split("==") for p in pip if "==" in p)
    # Conda users get the CPU set: the full tensorflow wheel (the `tensorflow-gpu` extra) would sit beside tensorflow-cpu.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    gpu_only = {Requirement(r).name for r in project["optional-dependencies"]["tensorflow-gpu"]} - {"keras"}
    assert gpu_only == {"tensorflow"}
    assert conda_pins == {k: v for k, v in _constraint_pins().items() if k not in gpu_only}
    assert "-e ." in pip
    python = next(d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python="))
    assert python == "python=3.11"
    # The Horovod build step is named for conda users.
    assert "scripts/build_horovod.sh" in (ROOT / "environment.yml").read_text()


def test_dockerfiles_use_the_install_script_and_bring_what_it_needs():
    install = (ROOT / "scripts" / "install.sh").read_text()
    needed = re.search(r'for tool in "\$PYTHON" (.+); do', install).group(1).split()
    apt_for = {"c++": "build-essential", "make": "make", "patch": "patch"}
    for name in ("Dockerfile.cpu", "Dockerfile.gpu"):
        text = (ROOT / "docker" / name).read_text().replace("\\\n", " ")   # join continued lines
        assert re.search(r"^RUN .*bash scripts/install\.sh", text, re.M), name
        # hvdsync itself goes in last, from the build context mounted for one step (tests/repo/test_docker.py).
        assert re.search(r"^RUN --mount=type=bind,target=(\S+),rw .*pip install .*--no-deps .*\1$", text, re.M), name
        froms = re.findall(r"^FROM (\S+)", text, re.M)
        assert froms and not any(f.endswith(":latest") or ":" not in f for f in froms if "$" not in f), froms
        apt = " ".join(re.findall(r"apt-get install[^\n]*", text))
        assert all(apt_for[t] in apt for t in needed), (name, needed, apt)
    # Each GPU image fails its build unless check-build lists NCCL, its own framework and Gloo.
    gpu = (ROOT / "docker" / "Dockerfile.gpu").read_text()
    assert re.search(r'for part in NCCL "\$name" Gloo; do grep -q "\\\[X\\\] \$part"', gpu)
    assert 'name="$([ "$FRAMEWORK" = torch ] && echo PyTorch || echo TensorFlow)"' in gpu


def test_ci_runs_the_readme_test_command_and_nothing_else():
    ci = [ln for ln in (ROOT / ".ci" / "run").read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    assert ci[-1].strip() == "make test"
    readme = (ROOT / "README.md").read_text()
    first_block = re.search(r"```(?:bash|sh)?\n(.*?)```", readme, re.S).group(1)
    assert "make demo" in first_block and "make test" in first_block


def test_every_make_target_parses_and_test_sets_up_the_system_then_the_venv_then_runs_pytest():
    # `make -n` reads the whole Makefile: a recipe line written into the wrong place breaks every target, CI's too.
    targets = re.findall(r"^\.PHONY:(.*)$", (ROOT / "Makefile").read_text(), re.M)[0].split()
    # Run as make's child (CI's `make test`), a nested make prints "Entering directory" lines: not here.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}

    def dry(target):
        return subprocess.run(["make", "--no-print-directory", "-n", target], cwd=ROOT, capture_output=True,
                              text=True, env=env)

    for target in targets:
        out = dry(target)
        assert out.returncode == 0, (target, out.stderr)
    # The system's packages (sshd, OpenMPI, Slurm) come first, so that the one Horovod build of the set-up has MPI
    # where the tests use it; then the set-up, then pytest, last: the one-process folders on 2 xdist workers, then
    # every other folder (the two together are the whole suite).
    lines = dry("test").stdout.splitlines()
    last = [line.split()[-1] for line in lines]
    assert last.index("scripts/install_test_hosts.sh") < last.index("scripts/install.sh"), last
    one_process, rest = (line.split() for line in lines[-2:])
    assert one_process[1:] == ["-m", "pytest", "-n", "2", "tests/unit", "tests/repo"], lines
    assert rest[1:] == ["-m", "pytest", "--ignore=tests/unit", "--ignore=tests/repo"], lines


def test_each_horovod_patch_says_why_and_which_upstream_change():
    patches = sorted((ROOT / "scripts" / "horovod-patches").glob("*.patch"))
    assert len(patches) >= 2
    for p in patches:
        head = p.read_text().split("\n--- ", 1)[0]
        assert "Why:" in head and "Upstream:" in head, p.name


def test_no_file_carries_a_machine_absolute_path():
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    pattern = re.compile(r"(?<![\w.])/(work|root|home/\w+|opt/wheels|tmp/hvdsrc)/")
    offenders = [f for f in files if (ROOT / f).is_file() and f.endswith((".py", ".md", ".sh", ".yml", ".toml", ".cfg",
                                                                          ".ipynb", "Makefile", ".txt"))
                 and pattern.search((ROOT / f).read_text(errors="replace"))]
    assert offenders == []


# -- the product and the lab: two distributions ---------------------------------------------------------------------

def _lab_project() -> dict:
    return tomllib.loads((ROOT / "hvdlab" / "pyproject.toml").read_text())


def test_the_lab_lists_every_package_folder_and_is_released_with_the_product():
    lab = _lab_project()
    folders = sorted(".".join(("hvdlab",) + p.parent.relative_to(ROOT / "hvdlab").parts)
                     for p in (ROOT / "hvdlab").rglob("__init__.py") if "__pycache__" not in p.parts)
    assert sorted(lab["tool"]["setuptools"]["packages"]) == folders
    product = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert lab["project"]["version"] == product["version"]
    assert Requirement(next(r for r in lab["project"]["dependencies"] if r.startswith("hvdsync"))).specifier.contains(
        product["version"])


def test_make_install_installs_the_lab_beside_the_product():
    install = (ROOT / "scripts" / "install.sh").read_text()
    assert re.search(r'pip install .*--no-deps -e \./hvdlab', install)
    assert "-e ./hvdlab" in (ROOT / "environment.yml").read_text()


def test_the_products_wheel_has_no_lab_and_the_labs_wheel_only_the_lab(tmp_path):
    # Built from copies (pip builds in the source folder, and the checkout stays clean), without isolation: the
    # venv's setuptools, no network.
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "hvdsync", tmp_path / "hvdsync", ignore=skip)
    shutil.copytree(ROOT / "hvdlab", tmp_path / "lab", ignore=skip)
    (tmp_path / "hvdlab").mkdir()  # a folder of that name beside the product's config must not pull the lab in
    (tmp_path / "hvdlab" / "__init__.py").write_text("")
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                          "--wheel-dir", str(tmp_path / "wheels"), str(tmp_path), str(tmp_path / "lab")],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    tops = {}
    for wheel in (tmp_path / "wheels").glob("*.whl"):
        names = zipfile.ZipFile(wheel).namelist()
        tops[wheel.name.split("-")[0]] = sorted({n.split("/")[0] for n in names if ".dist-info/" not in n})
        assert all(n.endswith(".py") for n in names if ".dist-info/" not in n), wheel.name
    assert tops == {"hvdsync": ["hvdsync"], "hvdlab": ["hvdlab"]}
