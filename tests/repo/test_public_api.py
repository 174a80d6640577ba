"""The public API is what docs/api.md lists: every name there imports from the path it names, the scripts users copy
(README, examples/) import only from it, the old paths warn with the adapter's name, and the version is the same everywhere."""
import ast
import importlib
import pathlib
import re
import tomllib
import warnings

import pytest
from packaging.version import Version

ROOT = pathlib.Path(__file__).resolve().parents[2]
API = (ROOT / "docs" / "api.md").read_text()


def _documented() -> dict[str, list[str]]:
    """``{module: [names]}`` from docs/api.md: a ``### `module` `` heading, then bullets whose backticked names come
    before the first ``:`` after a backtick (a bullet may wrap onto indented lines)."""
    bullets: list[list[str]] = []  # [module, bullet text]
    modules: list[str] = []
    for line in API.split("\n## Old paths")[0].splitlines():
        if heading := re.fullmatch(r"### `([\w.]+)`", line):
            modules.append(heading.group(1))
        elif line.startswith("- ") and modules:
            bullets.append([modules[-1], line[2:]])
        elif line.startswith("  ") and bullets:
            bullets[-1][1] += " " + line.strip()
    found: dict[str, list[str]] = {m: [] for m in modules}
    for module, text in bullets:
        found[module] += _names(text)
    return found


def _names(bullet: str) -> list[str]:
    head = bullet.split("`:", 1)[0] + "`"
    return [item.split("(")[0] for item in re.findall(r"`([^`]+)`", head)]


def _old_paths() -> list[tuple[str, list[str], str, str]]:
    """The old-path table's rows: (old module, the names it forwards, the version it moved in, the one it goes in)."""
    rows = re.findall(r"^\| `([\w.]+)` \| (.+?) \| `hvdsync.torch`, `hvdsync.tensorflow` \| ([\d.]+) \| ([\d.]+) \|$",
                      API, re.M)
    return [(old, re.findall(r"`(\w+)`", names), moved, goes) for old, names, moved, goes in rows]


def test_the_page_lists_the_adapters_config_launchers_registry_and_datasets_not_the_core():
    documented = _documented()
    assert {"hvdsync", "hvdsync.config", "hvdsync.torch", "hvdsync.tensorflow", "hvdsync.launch", "hvdsync.registry",
            "hvdsync.datasets"} <= set(documented)
    assert [m for m in documented if m.startswith("hvdsync.core")] == []
    for adapter in ("hvdsync.torch", "hvdsync.tensorflow"):
        assert {"ShardPlan", "loss_scale", "get_codec", "StepSpread", "SampleLedger", "CheckpointStore"} \
            <= set(documented[adapter])
    assert "distributed_optimizer" in documented["hvdsync.tensorflow"]
    assert sum(map(len, documented.values())) >= 100
    assert all(documented.values()), [m for m, names in documented.items() if not names]


def test_every_documented_name_imports_from_its_documented_path():
    missing = [f"{module}.{name}" for module, names in _documented().items()
               for name in names if not hasattr(importlib.import_module(module), name)]
    assert missing == []


def test_the_adapters_document_the_same_names_except_their_backend_classes():
    documented = _documented()
    torch_only = set(documented["hvdsync.torch"]) - set(documented["hvdsync.tensorflow"])
    assert torch_only == {"TorchBackend", "LoaderSteps"}


def _imports_from_hvdsync(source: str) -> list[tuple[str, str]]:
    pairs = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "hvdsync":
            pairs += [(node.module, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            pairs += [(a.name, "") for a in node.names if a.name.split(".")[0] == "hvdsync"]
    return pairs


def _readme_code() -> str:
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    return "\n".join(blocks)


def test_readme_and_examples_import_only_documented_paths():
    documented = _documented()
    sources = {"README.md": _readme_code()}
    sources |= {p.relative_to(ROOT).as_posix(): p.read_text() for p in sorted((ROOT / "examples").rglob("*.py"))}
    outside = []
    for where, source in sources.items():
        for module, name in _imports_from_hvdsync(source):
            # `from hvdsync import launch` names a documented module; `from hvdsync.torch import fit` a name.
            ok = (f"{module}.{name}" in documented or name in documented.get(module, ())) if name else module in documented
            if not ok:
                outside.append(f"{where}: {module} {name}".strip())
    assert len(sources) > 5 and outside == []


_OLD = [(old, name, goes) for old, names, _, goes in _old_paths() for name in names]


@pytest.mark.parametrize(("old", "name", "goes"), _OLD, ids=[f"{o}.{n}" for o, n, _ in _OLD])
def test_an_old_path_imports_the_adapters_object_and_warns_with_the_adapters_name(old, name, goes):
    import hvdsync.tensorflow
    import hvdsync.torch

    module = importlib.import_module(old)
    with pytest.warns(DeprecationWarning) as caught:
        value = getattr(module, name)
    assert value is getattr(hvdsync.torch, name) is getattr(hvdsync.tensorflow, name)
    message = str(caught[0].message)
    assert f"{old}.{name}" in message and f"hvdsync.torch.{name}" in message
    assert f"hvdsync.tensorflow.{name}" in message and f"goes in {goes}" in message
    # The warning names the line that took the name (here this file), so Python's default filter shows it to users.
    assert caught[0].filename == __file__


def test_the_table_forwards_every_core_name_the_adapters_export():
    from hvdsync.adapter import FROM_THE_CORE

    exported = {name for names in FROM_THE_CORE.values() for name in names}
    forwarded = {name for _, names, moved, _ in _old_paths() if moved == "0.3.0" for name in names}
    assert len(exported) == 15 and exported <= forwarded, exported - forwarded
    assert {"hvdsync.core.sharding", "hvdsync.core.scaling"} <= {old for old, *_ in _old_paths()}


@pytest.mark.parametrize("old", sorted({old for old, *_ in _old_paths()}))
def test_an_old_path_does_not_warn_for_python_s_own_look_ups(old):
    module = importlib.import_module(old)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not hasattr(module, "__wrapped__")
        with pytest.raises(AttributeError, match=old):
            module.__wrapped__  # noqa: B018


def _deprecated_imports(source: str) -> list[str]:
    forwarded = {old: set(names) for old, names, *_ in _old_paths()}
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module in forwarded:
            found += [f"{node.module}.{a.name}" for a in node.names if a.name in forwarded[node.module]]
    return found


def test_no_module_of_the_product_the_lab_the_tests_or_the_scripts_imports_an_old_path():
    # So hvdsync never warns on its own account: only a user's import of an old path does.
    here = pathlib.Path(__file__).resolve()
    files = [p for top in ("hvdsync", "hvdlab", "benchmarks", "tests", "examples", "notebooks")
             for p in sorted((ROOT / top).rglob("*.py")) if p.resolve() != here]
    offenders = [f"{p.relative_to(ROOT)}: {name}" for p in files for name in _deprecated_imports(p.read_text())]
    assert len(files) > 100 and offenders == []


def test_the_old_path_check_finds_a_deprecated_import():
    assert _deprecated_imports("from hvdsync.core.train.sharding import ShardPlan\n"
                               "from hvdsync.core.comm.codecs import WireCounter, get_codec\n") == \
        ["hvdsync.core.train.sharding.ShardPlan", "hvdsync.core.comm.codecs.get_codec"]


def test_the_version_is_the_same_in_the_package_the_project_and_the_change_log():
    import hvdsync
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    newest = re.search(r"^## (\S+)", (ROOT / "CHANGELOG.md").read_text(), re.M).group(1)
    # Between releases the package is the coming one's .dev0 and the change log's newest heading is that release.
    assert hvdsync.__version__ == version == "0.3.0.dev0" and Version(version).base_version == newest == "0.3.0"


def test_the_change_log_has_every_version_newest_first_breaking_moves_first():
    text = (ROOT / "CHANGELOG.md").read_text()
    versions = re.findall(r"^## (\S+)", text, re.M)
    assert versions == ["0.3.0", "0.2.0", "0.1.0"]
    newest = text.split("\n## 0.2.0")[0]
    sections = re.findall(r"^### (.+)", newest, re.M)
    assert sections[0].startswith("Breaking")
    for old, _, moved, _ in _old_paths():
        if moved in versions:  # a move of the coming release goes into its section when that is written
            assert f"`{old}`" in text.split(f"\n## {moved}")[1].split("\n## ")[0]
