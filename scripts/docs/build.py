"""Build the documentation site into site/: ``make docs`` runs this.

1. The notebooks' executed copies (scripts/docs/executed.py): fresh ones reused, the others executed, or rendered
   as they are with a visible note when asked (``--missing render``, ``--stale render``).
2. Staging into build/docs-src with the repo's own layout: the pages mkdocs.yml's nav names, every file those pages
   link to (transitively, so a link that works on GitHub works on the site: a linked JSON result or source file is
   copied as a static file), the executed notebooks with a note on when they ran and how long they took, and one
   mkdocstrings page per ``api/<module>.md`` nav entry; mkdocs.yml's extra_css from beside this script.
3. ``mkdocs build`` (mkdocs-material, mkdocs-jupyter, mkdocstrings; mkdocs.yml).

    python -m scripts.docs.build                                  # what `make docs` runs
    python -m scripts.docs.build --missing render --stale render  # no notebook executed: render what exists
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import yaml

from scripts.docs.executed import EXECUTED, POLICIES, ROOT, Copy, ensure, notebooks

STAGE = ROOT / "build" / "docs-src"
# Top-level folders never staged, whatever links there: environments, build outputs, run stores.
SKIP = {".venv", "build", "site", "mlruns", ".git", "node_modules"}
LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)|(?:href|src)=\"([^\"]+)\"")


def nav_pages(nav) -> list[str]:
    """Every page path named in a mkdocs nav (globs kept as they are)."""
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, dict):
        return [p for v in nav.values() for p in nav_pages(v)]
    return [p for e in nav or [] for p in nav_pages(e)]


def links(text: str) -> list[str]:
    """Relative link targets in markdown or HTML, without their #fragment; web, mail and anchor-only links left out."""
    found = [a or b for a, b in LINK.findall(text)]
    return [t.split("#")[0] for t in found if t.split("#")[0] and not re.match(r"^[a-z][a-z0-9+.-]*:|^/", t)]


def linked_files(page: Path, root: Path = ROOT) -> list[Path]:
    """The repo files a page links to (a folder's README.md for a link to a folder)."""
    if page.suffix == ".ipynb":
        import nbformat
        text = "\n".join(c.source for c in nbformat.read(page, as_version=4).cells if c.cell_type == "markdown")
    else:
        text = page.read_text(encoding="utf-8")
    out = []
    for target in links(text):
        path = (page.parent / target).resolve()
        if not path.is_relative_to(root) or set(path.relative_to(root).parts[:1]) & SKIP:
            continue
        if path.is_dir() and (path / "README.md").is_file():
            path = path / "README.md"
        if path.is_file():
            out.append(path)
    return out


def note(copy: Copy) -> str:
    """The line shown under a rendered notebook's title: when its outputs were made, and from what."""
    meta = copy.meta
    if copy.action == "source":
        return ("> **Not executed**: this page shows the notebook without its outputs (no executed copy was found; "
                "`make docs` executes it).")
    when = datetime.strptime(meta["executed_at"], "%Y-%m-%dT%H:%M:%SZ").strftime("%Y-%m-%d %H:%M UTC")
    if copy.action == "stale":
        return (f"> **Stale outputs**: executed {when} ({meta['seconds']} s) from an earlier version of this notebook; "
                "the code has changed since, so code and outputs may disagree. `make docs` executes it again.")
    return (f"> Outputs from a run of this exact notebook on {when}: it took {meta['seconds']} s from top to bottom "
            "(2 local Horovod workers on CPU, Gloo).")


def stage_notebook(copy: Copy, out: Path) -> None:
    import nbformat

    nb = nbformat.read(copy.source if copy.action == "source" else copy.executed, as_version=4)
    nb.cells.insert(1, nbformat.v4.new_markdown_cell(note(copy)))
    out.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, out)


def stage(config: dict, copies: list[Copy], out: Path = STAGE, root: Path = ROOT) -> dict[str, int]:
    """Lay out build/docs-src for mkdocs; returns how many files of each kind were staged."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    pending: list[Path] = []
    for page in nav_pages(config["nav"]):
        if page.startswith("api/"):
            module = page.removeprefix("api/").removesuffix(".md")
            (out / "api").mkdir(exist_ok=True)
            (out / page).write_text(f"::: {module}\n", encoding="utf-8")
        else:
            if "*" not in page and not (root / page).is_file():
                raise FileNotFoundError(f"mkdocs.yml's nav names {page}, which does not exist: remove it or add it")
            pending += [p for p in root.glob(page) if p.is_file()] if "*" in page else [root / page]
    for css in config.get("extra_css", []):        # kept beside this script: a site asset, not a page of the repo
        shutil.copy2(Path(__file__).with_name(css), out / css)
    rendered = {c.source.resolve(): c for c in copies}
    pending += list(rendered)
    seen: set[Path] = set()
    counts = {"pages": 0, "notebooks": 0, "static": 0}
    while pending:
        path = pending.pop().resolve()
        if path in seen:
            continue
        seen.add(path)
        target = out / path.relative_to(root)
        if path in rendered:
            stage_notebook(rendered[path], target)
            counts["notebooks"] += 1
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
            counts["pages" if path.suffix == ".md" else "static"] += 1
        if path.suffix in (".md", ".ipynb"):
            pending += linked_files(path, root)
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--missing", choices=POLICIES, default="execute",
                        help="a notebook without an executed copy: execute it, render it without outputs, or fail")
    parser.add_argument("--stale", choices=POLICIES, default="execute",
                        help="an executed copy of an older version: execute again, render it marked stale, or fail")
    parser.add_argument("--timeout", type=int, default=900, help="per notebook cell, seconds")
    parser.add_argument("--strict", action="store_true", help="mkdocs --strict: a warning (a broken link) fails")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    try:
        copies = ensure(notebooks(), EXECUTED, args.missing, args.stale, args.timeout)
    except RuntimeError as e:
        print(f"[docs] error: {e}", file=sys.stderr)
        return 1
    t_notebooks = time.perf_counter() - start
    try:
        counts = stage(config, copies)
    except FileNotFoundError as e:
        print(f"[docs] error: {e}", file=sys.stderr)
        return 1
    t_stage = time.perf_counter() - start - t_notebooks
    cmd = [sys.executable, "-m", "mkdocs", "build", "--clean", "-f", str(ROOT / "mkdocs.yml")]
    # NO_MKDOCS_2_WARNING: mkdocs-material prints a banner about its successor on every build; it is not ours to act on.
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(cmd + (["--strict"] if args.strict else []), cwd=ROOT, env=env)
    if result.returncode:
        print(f"[docs] error: mkdocs build failed (exit {result.returncode})", file=sys.stderr)
        return result.returncode
    t_mkdocs = time.perf_counter() - start - t_notebooks - t_stage
    actions = {a: sum(c.action == a for c in copies) for a in ("reused", "executed", "stale", "source")}
    print(f"[docs] site/ built in {time.perf_counter() - start:.1f} s (notebooks {t_notebooks:.1f} s, staging "
          f"{t_stage:.1f} s, mkdocs {t_mkdocs:.1f} s); staged {counts}; notebooks {actions}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
