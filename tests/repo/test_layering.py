"""The house's arrows point one way: checked on the source (every import, also those inside functions) and on what
importing the core loads.

    hvdsync.core     imports no framework, no Horovod, and nothing of hvdsync above it (config, registry, launch,
                     adapters): callers hand it built objects and callables
    hvdsync          never imports the lab package (hvdlab), which imports hvdsync
"""
import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
CORE = ROOT / "hvdsync" / "core"
FRAMEWORKS = ("torch", "tensorflow", "keras", "jax", "horovod")
ABOVE_THE_CORE = ("hvdsync.config", "hvdsync.registry", "hvdsync.launch", "hvdsync.torch", "hvdsync.tensorflow",
                  "hvdsync.adapter", "hvdsync.datasets", "hvdsync.fitting", "hvdsync.elastic", "hvdlab")


def _imports(path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
            # `from hvdsync import config` names the module in the alias, not in node.module
            if node.module in ("hvdsync", "hvdsync.core"):
                yield from (f"{node.module}.{a.name}" for a in node.names)


def _offenders(root: pathlib.Path, forbidden: tuple[str, ...]) -> list[tuple[str, str]]:
    return [(str(p.relative_to(ROOT)), m) for p in sorted(root.rglob("*.py")) for m in _imports(p)
            if any(m == f or m.startswith(f + ".") for f in forbidden)]


def test_the_core_imports_no_framework_and_no_horovod():
    assert _offenders(CORE, FRAMEWORKS) == []


def test_the_core_imports_nothing_above_it():
    assert _offenders(CORE, ABOVE_THE_CORE) == []


def test_the_product_never_imports_the_lab():
    assert _offenders(ROOT / "hvdsync", ("hvdlab",)) == []


def test_the_checks_see_an_upward_import_inside_a_function(tmp_path):
    # The arrows that used to point up were function-local imports: the scan must see those.
    (tmp_path / "m.py").write_text("def f():\n    from hvdsync.config import Config\n    return Config\n")
    assert [m for _, m in _offenders_in(tmp_path)] == ["hvdsync.config"]


def _offenders_in(root):
    return [(p.name, m) for p in root.rglob("*.py") for m in _imports(p)
            if any(m == f or m.startswith(f + ".") for f in ABOVE_THE_CORE)]


def test_importing_every_core_module_loads_no_framework_and_nothing_above_it():
    modules = [".".join(("hvdsync", "core") + p.relative_to(CORE).with_suffix("").parts).removesuffix(".__init__")
               for p in CORE.rglob("*.py")]
    watched = FRAMEWORKS + ("hvdsync.config", "hvdsync.registry", "hvdsync.launch", "hvdlab")
    # What `import hvdsync` itself loads (the package's __init__ exports the config) is not the core's doing.
    code = ("import sys, importlib, hvdsync\n"
            "before = set(sys.modules)\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            f"print(sorted(k for k in set(sys.modules) - before if any(k == w or k.startswith(w + '.') for w in {watched!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.strip() == "[]"
