"""The ways in agree with each other: pins, Dockerfiles, CI, README."""
import pathlib
import re
import subprocess
import tomllib

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _pyproject_pins():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        reqs += [r for r in extra if not r.startswith("hvdsync")]
    return dict(r.split("==") for r in reqs)


def test_every_dependency_is_pinned_exactly():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"]) + [r for extra in project["optional-dependencies"].values()
                                            for r in extra if not r.startswith("hvdsync")]
    assert reqs and all(re.fullmatch(r"[A-Za-z0-9_.-]+==[0-9][0-9A-Za-z.+]*", r) for r in reqs), reqs


def test_environment_yml_pins_agree_with_pyproject():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    conda_pins = dict(p.split("==") for p in pip if "==" in p)
    assert conda_pins == _pyproject_pins()
    assert "-e ." in pip
    # The Horovod build step is named for conda users.
    assert "scripts/build_horovod.sh" in (ROOT / "environment.yml").read_text()


def test_dockerfiles_use_the_install_script_and_bring_what_it_needs():
    install = (ROOT / "scripts" / "install.sh").read_text()
    needed = re.search(r'for tool in "\$PYTHON" (.+); do', install).group(1).split()
    apt_for = {"c++": "build-essential", "make": "make", "patch": "patch"}
    for name in ("Dockerfile.cpu", "Dockerfile.gpu"):
        text = (ROOT / "docker" / name).read_text().replace("\\\n", " ")   # join continued lines
        assert re.search(r"^RUN .*bash scripts/install\.sh", text, re.M), name
        assert re.search(r"^COPY \. \.", text, re.M), name
        froms = re.findall(r"^FROM (\S+)", text, re.M)
        assert froms and not any(f.endswith(":latest") or ":" not in f for f in froms if "$" not in f), froms
        apt = " ".join(re.findall(r"apt-get install[^\n]*", text))
        assert all(apt_for[t] in apt for t in needed), (name, needed, apt)
    assert r"\[X\] NCCL" in (ROOT / "docker" / "Dockerfile.gpu").read_text()  # the GPU image checks NCCL


def test_ci_runs_the_readme_test_command_and_nothing_else():
    ci = [ln for ln in (ROOT / ".ci" / "run").read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    assert ci[-1].strip() == "make test"
    readme = (ROOT / "README.md").read_text()
    first_block = re.search(r"```(?:bash|sh)?\n(.*?)```", readme, re.S).group(1)
    assert "make demo" in first_block and "make test" in first_block


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
