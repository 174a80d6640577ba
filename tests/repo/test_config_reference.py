"""docs/config.md is the config as the code defines it: generated from the section dataclasses, each field described."""
import json
import pathlib

from hvdsync.config import reference

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "config.md"


def test_every_field_is_described_and_every_description_names_a_field():
    problems = reference.problems()
    assert not problems, "\n".join(problems)


def test_docs_config_md_is_generated_from_the_current_dataclasses():
    written = DOC.read_text() if DOC.is_file() else ""
    assert written == reference.markdown(), f"docs/config.md is out of date; regenerate it: {reference.COMMAND}"


def test_the_reference_lists_every_field_once_with_its_default():
    text = reference.markdown()
    for section, cls in reference.sections():
        for name, value in vars(cls()).items():
            rows = [ln for ln in text.splitlines() if ln.startswith(f"| `{section}.{name}` |")]
            assert len(rows) == 1, (section, name, rows)
            assert f"| `{json.dumps(value)}` |" in rows[0], (section, name, rows[0])


def test_an_entry_for_several_fields_describes_each_and_continuation_lines_join():
    class Example:
        """Example.

        Args:
            low / high: the range,
                inclusive (see :func:`~pkg.mod.fn`, ``x``).
            mode: one of a | b.

        Returns:
            nothing.
        """

    assert reference.descriptions(Example) == {"low": "the range, inclusive (see `pkg.mod.fn`, `x`).",
                                               "high": "the range, inclusive (see `pkg.mod.fn`, `x`).",
                                               "mode": "one of a \\| b."}
