"""docs/troubleshooting.md: the cheap reproductions (those marked *Checked by the tests*) run here as the page writes
them, from the repository root, and must still print the symptom the page quotes. The others (a hang stopped by a
timeout, an elastic job resetting, a store that does not answer) take minutes and are run by hand."""
from __future__ import annotations

import os
import re
import socket
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "troubleshooting.md"
MARK = "*Checked by the tests*"

# Per checked section (its heading): a line of the symptom that the page quotes and the command must print.
SYMPTOMS = {
    "The host name resolves to loopback": "(loopback) but the job also runs on 192.0.2.10",
    "Tensors that differ in shape or name across ranks":
        "Mismatched ALLREDUCE tensor shapes: One rank sent a tensor of shape [10], but another rank sent a tensor of "
        "shape [11]",
    "The wrong network interface": "'nosuch0' is missing on this machine; the interfaces every host has:",
}


def sections(text: str) -> dict[str, str]:
    """{heading: body} of the page's level-2 sections."""
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def blocks(body: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```$", body, flags=re.M | re.S)


def unwrapped(text: str) -> str:
    """The quoted output with the page's line wrapping undone (a wrapped line goes on after one space)."""
    return re.sub(r"\s*\n\s*", " ", text)


def test_every_checked_section_is_listed_here_and_quotes_its_symptom():
    text = PAGE.read_text(encoding="utf-8")
    checked = {heading for heading, body in sections(text).items() if MARK in body}
    assert checked == set(SYMPTOMS), "the sections marked as checked and the ones this test runs differ"
    for heading in checked:
        body = sections(text)[heading]
        assert len(blocks(body, "bash")) == 1 and blocks(body, "text"), heading
        assert SYMPTOMS[heading] in unwrapped("\n".join(blocks(body, "text"))), f"{heading}: the page no longer quotes it"


def test_the_page_is_in_the_sites_nav():
    assert "docs/troubleshooting.md" in (ROOT / "mkdocs.yml").read_text(encoding="utf-8")


def _loopback_hostname() -> bool:
    try:
        return socket.gethostbyname(socket.gethostname()).startswith("127.")
    except OSError:
        return False


@pytest.mark.timeout(400)
@pytest.mark.parametrize("heading", sorted(SYMPTOMS))
def test_the_reproduction_still_shows_the_symptom(heading, tmp_path):
    if heading == "The host name resolves to loopback" and not _loopback_hostname():
        pytest.skip("this machine's host name does not resolve to loopback: the symptom cannot appear here")
    (command,) = blocks(sections(PAGE.read_text(encoding="utf-8"))[heading], "bash")
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp_path), "HOME": str(home)}
    done = subprocess.run(["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=360)
    output = done.stdout + done.stderr
    assert done.returncode != 0, f"{heading}: the reproduction did not fail\n{output[-3000:]}"
    assert SYMPTOMS[heading] in output, f"{heading}: the quoted symptom is gone\n{output[-3000:]}"
