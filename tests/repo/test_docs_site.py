"""The documentation site's sources (make docs): no page forgotten by the nav, executed notebooks reused only when they
were executed from today's notebook, and the staging that makes the repo's links work on the site. No mkdocs, no
browser, no network here: `make docs-check` is the browser check."""
import hashlib
import json
from pathlib import Path

import nbformat
import pytest
import yaml

from scripts.docs import build, executed, hooks, runtimes

ROOT = Path(__file__).resolve().parents[2]
CONFIG = yaml.safe_load((ROOT / "mkdocs.yml").read_text())


def _nav_covers(path: str) -> bool:
    """Whether the nav names ``path``, by name or through a glob entry (expanded like the mkdocs hook does)."""
    expanded = build.nav_pages(hooks.expand(CONFIG["nav"], ROOT))
    return path in expanded


def test_every_guide_measurement_and_benchmark_page_is_in_the_nav():
    pages = ["README.md", "benchmarks/README.md", "benchmarks/results/README.md"]
    pages += [p.relative_to(ROOT).as_posix() for p in sorted((ROOT / "docs").glob("*.md"))]
    pages += [p.relative_to(ROOT).as_posix() for p in sorted((ROOT / "docs" / "measurements").glob("*.md"))]
    missing = [p for p in pages if not _nav_covers(p)]
    assert missing == [], f"add these pages to mkdocs.yml's nav: {missing}"
    assert "docs/config.md" in pages and "docs/measurements/README.md" in pages


def test_every_notebook_is_in_the_nav_once_and_in_order():
    stems = [p.relative_to(ROOT).as_posix() for p in executed.notebooks()]
    assert len(stems) >= 18
    nav = [p for p in build.nav_pages(hooks.expand(CONFIG["nav"], ROOT)) if p.endswith(".ipynb")]
    assert nav == stems


def test_nav_globs_pick_up_a_new_notebook_without_listing_it_twice(tmp_path):
    for name in ("README.md", "01_a.ipynb", "12a_b.ipynb", "12b_c.ipynb", "notes.txt"):
        (tmp_path / "notebooks").mkdir(exist_ok=True)
        (tmp_path / "notebooks" / name).write_text("x")
    nav = [{"Notebooks": ["notebooks/README.md", "notebooks/12a_b.ipynb", "notebooks/[0-9][0-9]*.ipynb"]}]
    assert hooks.expand(nav, tmp_path) == [{"Notebooks": ["notebooks/README.md", "notebooks/12a_b.ipynb",
                                                          {"01 · A": "notebooks/01_a.ipynb"},
                                                          {"12b · C": "notebooks/12b_c.ipynb"}]}]


def test_notebooks_have_short_labels_in_the_nav():
    assert hooks.short_label("notebooks/03_hardware_and_network.ipynb") == "03 · Hardware and network"
    assert hooks.short_label("notebooks/12b_framework_best_practices_mistakes.ipynb") == \
        "12b · Framework best practices mistakes"
    labels = [next(iter(e)) for section in hooks.expand(CONFIG["nav"], ROOT) if isinstance(section, dict)
              for value in section.values() if isinstance(value, list) for e in value
              if isinstance(e, dict) and str(next(iter(e.values()))).endswith(".ipynb")]
    assert len(labels) >= 18 and all(len(label) <= 45 for label in labels), labels


def test_the_plugins_render_notebooks_from_executed_copies_and_the_api_from_docstrings():
    plugins = {next(iter(p)) if isinstance(p, dict) else p: (p[next(iter(p))] if isinstance(p, dict) else {})
               for p in CONFIG["plugins"]}
    assert plugins["mkdocs-jupyter"]["execute"] is False          # scripts/docs/executed.py executes, not the plugin
    assert plugins["mkdocs-jupyter"]["include"] == ["*.ipynb"]
    assert "mkdocstrings" in plugins and CONFIG["docs_dir"] == "build/docs-src" and CONFIG["site_dir"] == "site"
    api = [p for p in build.nav_pages(CONFIG["nav"]) if p.startswith("api/")]
    for page in api:         # each names a module that exists
        module = page.removeprefix("api/").removesuffix(".md").replace(".", "/")
        assert (ROOT / f"{module}.py").is_file() or (ROOT / module / "__init__.py").is_file(), page


# ---- executed copies: fresh, stale, missing ---------------------------------------------------------------------
def _notebook(path: Path, text: str) -> Path:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# 01 Title 一"),
                                         nbformat.v4.new_code_cell(f"print({text!r})")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


def test_executed_copy_is_reused_only_while_the_notebook_is_unchanged(tmp_path):
    source = _notebook(tmp_path / "01_tiny.ipynb", "first")
    out = tmp_path / "executed"
    assert executed.status(source, out).state == "missing"

    log = []
    [copy] = executed.ensure([source], out, log=log.append)
    assert copy.action == "executed" and copy.state == "fresh"
    kept = nbformat.read(out / "01_tiny.ipynb", as_version=4)
    assert kept.cells[1].outputs[0]["text"] == "first\n"
    assert kept.metadata["hvdsync"]["source_sha256"] == hashlib.sha256(source.read_bytes()).hexdigest()
    assert kept.metadata["hvdsync"]["seconds"] > 0 and kept.metadata["hvdsync"]["executed_at"].endswith("Z")

    written = (out / "01_tiny.ipynb").stat().st_mtime_ns
    [again] = executed.ensure([source], out, log=log.append)
    assert again.action == "reused" and (out / "01_tiny.ipynb").stat().st_mtime_ns == written
    assert any("reused" in line for line in log) and any("executed" in line for line in log)

    _notebook(source, "second")                                   # the notebook changed: its copy is stale
    assert executed.status(source, out).state == "stale"
    [stale] = executed.ensure([source], out, stale="render", log=log.append)
    assert stale.action == "stale" and "Stale outputs" in build.note(stale)
    with pytest.raises(RuntimeError, match="01_tiny \\(stale\\)"):
        executed.ensure([source], out, stale="fail", log=log.append)
    [redone] = executed.ensure([source], out, log=log.append)
    assert redone.action == "executed"
    assert nbformat.read(out / "01_tiny.ipynb", as_version=4).cells[1].outputs[0]["text"] == "second\n"
    assert "total (fresh)" in runtimes.table([executed.status(source, out)], markdown=True)


def test_bad_policy_is_refused_naming_the_allowed_ones(tmp_path):
    with pytest.raises(ValueError, match="missing='skip': must be one of execute, render, fail"):
        executed.ensure([], tmp_path, missing="skip")


def test_a_missing_notebook_renders_without_outputs_under_a_visible_note(tmp_path):
    source = _notebook(tmp_path / "01_tiny.ipynb", "x")
    [copy] = executed.ensure([source], tmp_path / "none", missing="render", log=lambda line: None)
    assert copy.action == "source"
    build.stage_notebook(copy, tmp_path / "out" / "01_tiny.ipynb")
    staged = nbformat.read(tmp_path / "out" / "01_tiny.ipynb", as_version=4)
    assert staged.cells[0].source.startswith("# 01") and "Not executed" in staged.cells[1].source
    assert len(nbformat.read(source, as_version=4).cells) == 2          # the committed notebook is left as it was


# ---- staging: the repo's links keep working on the site ----------------------------------------------------------
def test_staging_copies_linked_files_transitively_and_leaves_the_rest(tmp_path):
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    (root / "results").mkdir()
    (root / "README.md").write_text("[guide](docs/a.md) [web](https://example.org/x.md) [env](.venv/x.md)")
    (root / "docs" / "a.md").write_text("[r](../results/README.md#top) ![chart](../results/c.png) [dir](../results/) [home](../)")
    (root / "results" / "README.md").write_text("[data](run.json)")
    (root / "results" / "run.json").write_text(json.dumps({"x": 1}))
    (root / "results" / "c.png").write_bytes(b"png")
    (root / "unlinked.md").write_text("never staged")
    config = {"nav": [{"Home": "README.md"}, {"API": ["api/hvdsync.config.md"]}]}
    counts = build.stage(config, [], tmp_path / "out", root)
    staged = sorted(p.relative_to(tmp_path / "out").as_posix() for p in (tmp_path / "out").rglob("*") if p.is_file())
    assert staged == ["README.md", "api/hvdsync.config.md", "docs/a.md", "results/README.md", "results/c.png",
                      "results/run.json"]
    assert counts == {"pages": 3, "notebooks": 0, "static": 2}
    assert (tmp_path / "out" / "api" / "hvdsync.config.md").read_text() == "::: hvdsync.config\n"


def test_notebook_contents_links_are_mended_only_when_unambiguous():
    # The slugs mkdocs-jupyter 0.26 wrote for headings "3. ... up to `sync.grouped_mb`" and "4. own way: `torch.x` and
    # DDP", beside nbconvert's ids; a link with two possible targets and one with none are left as they are.
    html = ('<a href="#3-up-to">t</a><a href="#4-own-way-and-ddp">d</a><a href="#gone">g</a><a href="#a">a</a>'
            '<a href="#b">b</a><h2 id="3-up-to-syncgrouped_mb"></h2><h2 id="4-own-way-torchx-and-ddp"></h2>'
            '<h2 id="a"></h2><h2 id="a-b"></h2><h2 id="c-b"></h2>')
    mended = hooks.mend_anchors(html)
    assert 'href="#3-up-to-syncgrouped_mb"' in mended and 'href="#4-own-way-torchx-and-ddp"' in mended
    assert 'href="#gone"' in mended and 'href="#a"' in mended and 'href="#b"' in mended


def test_make_targets_install_the_docs_extra_and_the_browser_only_for_the_check():
    makefile = (ROOT / "Makefile").read_text()
    assert "$(PY) -m scripts.docs.build $(DOCS_ARGS)" in makefile and "$(PY) -m scripts.docs.check" in makefile
    assert "docs:" not in makefile.split("\ntest:")[1].split("\n\n")[0]        # make test does not build the site
    script = (ROOT / "scripts" / "install_docs_deps.sh").read_text()
    assert '-c constraints.txt -e ".[docs]"' in script and "fonts-noto-cjk" in script and "chromium-driver" in script
    assert "/site/" in (ROOT / ".gitignore").read_text().splitlines()     # the build, not docs/measurements/site/
