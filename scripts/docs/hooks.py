"""mkdocs hooks: nav entries with a ``*`` are globs over the staged pages; notebook pages' contents links mended.

``notebooks/[0-9][0-9]*.ipynb`` in mkdocs.yml's nav becomes every notebook, in order, so a new notebook (or 12 split
into 12a and 12b) is on the site without an edit to mkdocs.yml; each under a short label (:func:`short_label`).
Pages listed by name in the same section are not listed twice. Imports nothing from mkdocs:
tests/repo/test_docs_site.py calls :func:`expand` without it.
"""
from __future__ import annotations

import re
from pathlib import Path


def _named(section: list) -> set[str]:
    return {v for e in section for v in ([e] if isinstance(e, str) else e.values()) if isinstance(v, str)}


def expand(nav: list, docs_dir: Path) -> list:
    """``nav`` with each glob entry replaced by the matching pages under ``docs_dir``, sorted by path."""
    out = []
    listed = _named(nav)
    for entry in nav:
        if isinstance(entry, str) and "*" in entry:
            matches = sorted(p.relative_to(docs_dir).as_posix() for p in docs_dir.glob(entry) if p.is_file())
            out += [{short_label(m): m} if m.endswith(".ipynb") else m for m in matches if m not in listed]
        elif isinstance(entry, dict):
            out.append({title: expand(value, docs_dir) if isinstance(value, list) else value
                        for title, value in entry.items()})
        else:
            out.append(entry)
    return out


def short_label(path: str) -> str:
    """A notebook's label in the nav, from its file name: ``03_hardware_and_network.ipynb`` -> ``03 · Hardware and
    network``. The page itself shows the guide's full heading; the nav keeps to one short line per notebook."""
    number, _, words = Path(path).stem.partition("_")
    return f"{number} · {words.replace('_', ' ').capitalize()}" if words else number


def on_config(config):
    if config.get("nav"):
        config["nav"] = expand(config["nav"], Path(config["docs_dir"]))
    return config


def _in_order(words: list[str], within: list[str]) -> bool:
    rest = iter(within)
    return all(w in rest for w in words)     # `in` on an iterator consumes it: the words must come in this order


def mend_anchors(html: str) -> str:
    """Point each ``href="#x"`` with no ``id="x"`` on the page at the one id whose words contain x's words in order.

    mkdocs-jupyter (0.26) builds a notebook page's table of contents with its own slugs, which leave out inline code
    in a heading ("... up to `sync.grouped_mb`" gives "...-up-to"), while nbconvert's heading ids keep it
    ("...-up-to-syncgrouped_mb"): the contents link leads nowhere. Only an unambiguous match is mended; anything else
    stays for docs-check to report.
    """
    ids = set(re.findall(r'\bid="([^"]+)"', html))

    def fix(match: re.Match) -> str:
        anchor = match.group(1)
        if anchor in ids:
            return match.group(0)
        candidates = [i for i in ids if _in_order(anchor.split("-"), i.split("-"))]
        return f'href="#{candidates[0]}"' if len(candidates) == 1 else match.group(0)

    return re.sub(r'href="#([^"]+)"', fix, html)


def on_post_page(output, page, config):
    return mend_anchors(output) if page.file.src_uri.endswith(".ipynb") else output
