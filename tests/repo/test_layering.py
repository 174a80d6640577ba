"""The house's arrows point one way: checked on the source (every import, also those inside functions) and on what
importing the core loads.

    hvdsync.core     imports no framework, no Horovod, and nothing of hvdsync above it (config, registry, launch,
                     adapters): callers hand it built objects and callables; nor does it read a config's fields
                     (``cfg.train.epochs``): the layer above hands it the values (``LoopSettings``, ...)
    hvdsync          never imports the lab package (hvdlab), which imports hvdsync
    no circles       in hvdsync or hvdlab, counting imports inside functions and under ``if TYPE_CHECKING:``
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


def _config_reads(path: pathlib.Path) -> list[str]:
    """Every ``cfg.<section>.<field>`` in ``path``'s code (comments and docstrings are not code): an attribute two
    deep past a name ``cfg`` or an attribute ``.cfg`` (``ctx.cfg``, ``self.cfg``); ``cfg.a.b.c`` counts once."""
    reads = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute):
            root = node.value.value
            if (isinstance(root, ast.Name) and root.id == "cfg") or (isinstance(root, ast.Attribute)
                                                                     and root.attr == "cfg"):
                reads.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return reads


def test_the_core_reads_no_config_field():
    # The layer above (hvdsync.fitting, the adapters, the worker) builds what the core is handed from the config.
    reads = [r for p in sorted(CORE.rglob("*.py")) for r in _config_reads(p)]
    assert len(reads) == 0, f"the core reads config fields: {reads}"


def test_the_config_read_count_sees_every_form_and_no_prose(tmp_path):
    (tmp_path / "m.py").write_text(
        '"""Trains ``cfg.train.epochs`` epochs."""\n'
        "def f(cfg, ctx, self):\n"
        "    # cfg.data.batch_size in a comment is prose\n"
        "    return cfg.train.epochs, ctx.cfg.sync.op, self.cfg.monitor.every.real, cfg.flat(), ctx.cfg\n")
    assert _config_reads(tmp_path / "m.py") == ["m.py:4: cfg.train.epochs", "m.py:4: ctx.cfg.sync.op",
                                                "m.py:4: self.cfg.monitor.every"]


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


# -- import circles ------------------------------------------------------------------------------------------------
# A circle is closed by a function-local import (the module at the other end is half-built at the top), so the scan
# counts those too, and those under `if TYPE_CHECKING:`: such an import never runs, but it says that the two modules
# know each other, which is what a shared name in a module of its own (hvdsync.core.train.callbacks) avoids.

def _module_name(path: pathlib.Path, root: pathlib.Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph(package: str, root: pathlib.Path = ROOT) -> dict[str, set[str]]:
    """``{module: modules of the same package it imports}``; `from a.b import c` counts as importing `a.b.c` where
    that is a module, else `a.b`."""
    files = {_module_name(p, root): p for p in (root / package).rglob("*.py")}
    graph = {}
    for name, path in files.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: `from . import x`, `from ..m import y`
                    parts = here.split(".")[: len(here.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                targets |= {f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names}
        graph[name] = {t for t in targets if t in files and t != name}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected parts with more than one module (Tarjan's algorithm, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    part = stack[stack.index(node):]
                    del stack[stack.index(node):]
                    if len(part) > 1:
                        circles.append(sorted(part))
    return circles


def test_no_import_circles_in_the_product_or_the_lab():
    graph = _import_graph("hvdsync")
    assert len(graph) > 100
    # The circle this replaced (issue 50): callbacks <-> loop through TYPE_CHECKING, the loop building the observer.
    assert "hvdsync.core.train.callbacks" in graph["hvdsync.core.train.loop"]
    circles = [c for p in ("hvdsync", "hvdlab") for c in _circles(_import_graph(p))]
    assert circles == [], f"modules that import each other (also inside functions): {circles}"


def test_the_circle_scan_sees_circles_closed_inside_a_function_or_for_annotations(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.b import f\n")
    (pkg / "b.py").write_text("def f():\n    from pkg import a\n    return a\n")
    (pkg / "c.py").write_text("from . import d\n")
    (pkg / "d.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.c import x\n")
    (pkg / "e.py").write_text("import pkg.f\n")   # one way only: no circle
    (pkg / "f.py").write_text("X = 1\n")
    graph = _import_graph("pkg", tmp_path)
    assert graph["pkg.c"] == {"pkg.d"} and graph["pkg.d"] == {"pkg.c"} and graph["pkg.e"] == {"pkg.f"}
    assert _circles(graph) == [["pkg.a", "pkg.b"], ["pkg.c", "pkg.d"]]


def test_the_shared_loop_s_hooks_sit_below_the_loop_and_telemetry():
    # Callback, TrainContext and FitResult: what the loop, its callbacks and the adapters share, in a module that
    # imports neither the loop nor telemetry (nor anything that does), so no callback needs the loop to be defined.
    graph = _import_graph("hvdsync")
    below, seen = set(), ["hvdsync.core.train.callbacks", "hvdsync.core.train._context"]
    while seen:
        module = seen.pop()
        below.add(module)
        seen += [m for m in graph[module] if m not in below]
    assert below == {"hvdsync.core.train.callbacks", "hvdsync.core.train._context", "hvdsync.core.train._plan",
                     "hvdsync.core.train.shares", "hvdsync.core._moved"}
    # The loop builds no observer: whoever runs it hands one in (hvdsync.fitting.fit_loop), as any callback.
    assert not any(m.startswith("hvdsync.core.telemetry.observe") for m in graph["hvdsync.core.train.loop"])


def _env_reads(path):
    """The names of the environment variables a module reads by a literal (os.environ.get/[]/getenv)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") in ("get", "getenv", "pop") and node.args:
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                yield arg.value
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) \
                and isinstance(node.slice.value, str):
            yield node.slice.value


def _parameters(path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield from (a.arg for a in (*node.args.args, *node.args.kwonlyargs))


def test_the_product_reads_no_test_switch():
    # Fault injection is the lab's (hvdlab.faults, a callback named in train.callbacks): no variable of it is read,
    # and no launcher takes a `faults` argument, anywhere in the product.
    found = [(str(p.relative_to(ROOT)), name) for p in (ROOT / "hvdsync").rglob("*.py")
             for name in _env_reads(p) if "FAULT" in name.upper() or name.startswith("HVDLAB")]
    found += [(str(p.relative_to(ROOT)), arg) for p in (ROOT / "hvdsync").rglob("*.py")
              for arg in _parameters(p) if arg == "faults"]
    assert found == []


def test_the_switch_scan_sees_a_fault_variable_and_argument(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import os\ndef run(fn, faults=''):\n    return os.environ.get('HVDSYNC_FAULTS')\n")
    assert list(_env_reads(bad)) == ["HVDSYNC_FAULTS"] and "faults" in list(_parameters(bad))


def _test_only(path: pathlib.Path) -> list[str]:
    """Functions and methods that exist for tests: named ``inject_*`` or saying "test-only" in their docstring."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = (ast.get_docstring(node) or "").lower()
            if node.name.startswith("inject") or "test-only" in doc or "test only" in doc:
                found.append(f"{path.name}:{node.lineno}: {node.name}")
    return found


def test_the_product_has_no_test_only_hook():
    # Overflow injection is the lab's too (hvdlab.torch.overflow, hvdlab.tensorflow.overflow wrap the public
    # optimizer from outside): nothing in hvdsync exists only for tests, nor lands in a traced step's graph for them.
    assert [f for p in sorted((ROOT / "hvdsync").rglob("*.py")) for f in _test_only(p)] == []


def test_the_test_only_scan_sees_a_hook_by_name_and_by_docstring(tmp_path):
    bad = tmp_path / "precision.py"
    bad.write_text('class M:\n    def inject_overflow(self):\n        pass\n\n'
                   'def arm():\n    """Test-only: make the next step overflow."""\n')
    assert sorted(_test_only(bad)) == ["precision.py:2: inject_overflow", "precision.py:5: arm"]


def _private_imports(path: pathlib.Path, package: str, root: pathlib.Path = ROOT):
    """``module.name`` for every private name (``_x``) imported from another module of ``package``."""
    own = ".".join(path.relative_to(root).with_suffix("").parts)
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(package) \
                and node.module != own:
            yield from (f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_"))


def test_the_launchers_share_a_base_not_each_other_s_privates():
    # What local, elastic, Ray, MPI and Slurm launching share (build checks, progress, the driver's log and errors,
    # lost hosts) is hvdsync.launch.base; no launcher reaches into another's private names.
    found = [(p.name, name) for p in sorted((ROOT / "hvdsync" / "launch").glob("*.py"))
             for name in _private_imports(p, "hvdsync.launch")]
    assert found == []


def test_the_private_import_scan_sees_one(tmp_path):
    pkg = tmp_path / "hvdsync" / "launch"
    pkg.mkdir(parents=True)
    bad = pkg / "ray.py"
    bad.write_text("def f():\n    from hvdsync.launch.local import _follow, run\n"
                   "from hvdsync.launch.ray import _mine\n")
    assert list(_private_imports(bad, "hvdsync.launch", tmp_path)) == ["hvdsync.launch.local._follow"]


# -- one launcher template (issue 50) ------------------------------------------------------------------------------
# Each launcher is a subclass of hvdsync.launch.base.Launcher in a module of its own; what two of them share lives in
# base.py or a module below the launchers (runner.py, elastic_job.py), never in one launcher imported by another.

def _launcher_modules(root: pathlib.Path = ROOT) -> set[str]:
    """The modules of hvdsync.launch that define a launcher: a class with a ``start`` hook."""
    found = set()
    for path in (root / "hvdsync" / "launch").glob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and node.bases and any(
                    isinstance(f, ast.FunctionDef) and f.name == "start" for f in node.body):
                found.add(_module_name(path, root))
    return found


def _sideways(root: pathlib.Path = ROOT) -> list[tuple[str, str]]:
    """(launcher module, other launcher module it imports), counting imports inside functions."""
    launchers = _launcher_modules(root)
    graph = _import_graph("hvdsync", root)
    return sorted((m, t) for m in launchers for t in graph[m] if t in launchers)


def test_no_launcher_imports_another_launcher():
    assert _launcher_modules() == {"hvdsync.launch.local", "hvdsync.launch.elastic", "hvdsync.launch.ray",
                                   "hvdsync.launch.slurm"}
    assert _sideways() == []
    # What they share sits below all of them: the template and the elastic bookkeeping import no launcher.
    graph = _import_graph("hvdsync")
    below = ("hvdsync.launch.base", "hvdsync.launch.runner", "hvdsync.launch.elastic_job")
    assert [(m, t) for m in below for t in graph[m] if t in _launcher_modules()] == []


def test_the_sideways_scan_sees_a_launcher_importing_another_inside_a_function(tmp_path):
    pkg = tmp_path / "hvdsync" / "launch"
    pkg.mkdir(parents=True)
    for init in (tmp_path / "hvdsync" / "__init__.py", pkg / "__init__.py"):
        init.write_text("")
    (pkg / "base.py").write_text("class Launcher:\n    def start(self):\n        pass\n")
    (pkg / "local.py").write_text("from hvdsync.launch.base import Launcher\n"
                                  "class LocalLauncher(Launcher):\n    def start(self):\n        pass\n")
    (pkg / "elastic.py").write_text("from hvdsync.launch.base import Launcher\n"
                                    "class ElasticHosts(Launcher):\n    def start(self):\n"
                                    "        from hvdsync.launch.local import run\n        return run\n")
    assert _launcher_modules(tmp_path) == {"hvdsync.launch.local", "hvdsync.launch.elastic"}  # base: no bases
    assert _sideways(tmp_path) == [("hvdsync.launch.elastic", "hvdsync.launch.local")]
