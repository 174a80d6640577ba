"""The config reference (docs/config.md), generated from the section dataclasses so that it cannot drift from them.

Every field of every section (:class:`hvdsync.config.loading.Config`'s fields, in their order) becomes one row: its
dotted name, type, default and the description its class docstring gives under ``Args:``. An entry may describe
several fields at once (``min_np / max_np: ...``). tests/repo/test_config_reference.py fails when docs/config.md
differs from :func:`markdown`, when a field has no description, or when an ``Args`` entry names no field.

    python -m hvdsync.config.reference > docs/config.md
"""
from __future__ import annotations

import dataclasses
import inspect
import json
import re

from hvdsync.config.loading import Config

COMMAND = "python -m hvdsync.config.reference > docs/config.md"

# An ``Args:`` entry: four spaces (after inspect.getdoc's dedent), one or more field names joined by " / ", a colon.
_ENTRY = re.compile(r"^ {4}(\w+(?: / \w+)*): (.*)$")
# Sphinx roles (:mod:`x`, :class:`~a.b.C`) and double backticks read as plain inline code in Markdown.
_ROLE = re.compile(r":(?:mod|func|class|meth|data|attr):`~?([^`]+)`")


def sections() -> list[tuple[str, type]]:
    """``[(section name, dataclass), ...]`` in the order the config lists them."""
    return [(f.name, f.default_factory) for f in dataclasses.fields(Config)]  # type: ignore[misc]


def descriptions(cls: type) -> dict[str, str]:
    """The ``Args:`` entries of ``cls``'s docstring, one per field name (continuation lines joined)."""
    lines = (inspect.getdoc(cls) or "").splitlines()
    if "Args:" not in lines:
        return {}
    found: dict[str, str] = {}
    names: list[str] = []
    for line in lines[lines.index("Args:") + 1:]:
        if line and not line.startswith(" "):  # the next docstring section ends the Args
            break
        entry = _ENTRY.match(line)
        if entry:
            names = entry.group(1).split(" / ")
            for name in names:
                found[name] = entry.group(2)
        elif line.strip():
            for name in names:
                found[name] += " " + line.strip()
    return {name: _markdown_text(text) for name, text in found.items()}


def _markdown_text(text: str) -> str:
    text = _ROLE.sub(lambda m: f"``{m.group(1)}``", text).replace("``", "`")
    return text.replace("|", "\\|")  # a table cell ends at a bare pipe


def _default(f: dataclasses.Field) -> str:
    value = f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc]
    return json.dumps(value)  # JSON is valid YAML: what a config file or --set would hold


def _type(f: dataclasses.Field) -> str:
    return f.type if isinstance(f.type, str) else f.type.__name__


def problems() -> list[str]:
    """Fields without a description, and ``Args`` entries that name no field of their section."""
    found = []
    for section, cls in sections():
        fields = {f.name for f in dataclasses.fields(cls)}
        described = descriptions(cls)
        found += [f"{section}.{name}: no description in {cls.__name__}'s Args"
                  for name in sorted(fields - set(described))]
        found += [f"{section}.{name}: described in {cls.__name__}'s Args but not a field"
                  for name in sorted(set(described) - fields)]
    return found


def markdown() -> str:
    """docs/config.md: every section, every field, with its type, default and description."""
    out = [
        "# Config reference",
        "",
        f"Generated from `hvdsync/config/sections.py` by `{COMMAND}`;",
        "do not edit it by hand (tests/repo/test_config_reference.py fails when it differs from the code).",
        "",
        "A config is built from the defaults below, then a YAML file (`--config run.yaml`, one mapping per section),",
        "then `--set section.field=value` overrides (the value is read as YAML). Every value is checked when the",
        "config is built, before any worker starts; an error names the field and what is allowed. Defaults are",
        "written as YAML would read them. A script reads its config with `hvdsync.config.from_command_line`, the",
        "`hvdsync` command with the same options ([cli.md](cli.md)); a notebook builds one with `Config.from_dict`.",
        "",
        "Sections: " + ", ".join(f"[`{name}`](#{name})" for name, _ in sections()) + ".",
    ]
    for section, cls in sections():
        summary = (inspect.getdoc(cls) or "").split("\n\n", 1)[0].replace("\n", " ")
        out += ["", f"## {section}", "", _markdown_text(summary), "",
                "| field | type | default | description |", "| --- | --- | --- | --- |"]
        text = descriptions(cls)
        for f in dataclasses.fields(cls):
            out.append(f"| `{section}.{f.name}` | `{_type(f)}` | `{_default(f)}` | {text.get(f.name, '')} |")
    return "\n".join(out) + "\n"


def main() -> None:
    print(markdown(), end="")


if __name__ == "__main__":
    main()
