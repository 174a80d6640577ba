"""hvdsync.core never imports a framework: checked on the source and on what importing it loads."""
import ast
import pathlib
import subprocess
import sys

CORE = pathlib.Path(__file__).resolve().parents[2] / "hvdsync" / "core"
FORBIDDEN = ("torch", "tensorflow", "keras", "horovod.torch", "horovod.tensorflow", "jax")


def _imports(path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module


def test_no_framework_import_in_core_source():
    offenders = [(p.name, m) for p in CORE.rglob("*.py") for m in _imports(p)
                 if any(m == f or m.startswith(f + ".") for f in FORBIDDEN)]
    assert offenders == []


def test_importing_every_core_module_loads_no_framework():
    # Subpackages too (core/schemes/...).
    modules = [".".join(("hvdsync", "core") + p.relative_to(CORE).with_suffix("").parts).removesuffix(".__init__")
               for p in CORE.rglob("*.py")]
    code = ("import sys, importlib\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            "print(sorted(k for k in sys.modules if k.split('.')[0] in ('torch', 'tensorflow', 'keras')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
