"""`make lab` serves the notebooks: the Makefile's lab command is started for real (a free port, a token), asked over
HTTP for the notebooks and for the JupyterLab page, then shut down through its API."""
from __future__ import annotations

import os
import re
import secrets
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
VENV = Path(sys.executable).parent.parent     # the environment running the tests is the one `make` uses (.venv)
START_TIMEOUT = 120


def lab_command() -> list[str]:
    """The command ``make lab`` runs, as make itself expands it (a dry run: nothing is installed or started)."""
    out = subprocess.run(["make", "--no-print-directory", "--dry-run", "lab", f"VENV={VENV}"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    lines = [line for line in out.splitlines() if re.search(r"/jupyter lab(\s|$)", line)]
    assert len(lines) == 1, f"`make -n lab` should run one `jupyter lab` command:\n{out}"
    return shlex.split(lines[0])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_until_up(proc: subprocess.Popen, url: str, token: str, log) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            tail = "\n".join(log.read().splitlines()[-5:])
            raise AssertionError(f"JupyterLab exited with status {proc.returncode}:\n{tail}")
        try:
            if requests.get(f"{url}/api/status", headers={"Authorization": f"token {token}"}, timeout=5).ok:
                return
        except requests.ConnectionError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"JupyterLab did not answer on {url} within {START_TIMEOUT} s")


def test_make_lab_command_listens_on_localhost_and_serves_the_notebooks(tmp_path):
    command = lab_command()
    assert command[0] == str(VENV / "bin" / "jupyter") and command[1] == "lab"
    assert "--no-browser" in command
    assert command[command.index("--ip") + 1] == "127.0.0.1"
    assert command[command.index("--notebook-dir") + 1] == "notebooks"

    port, token = _free_port(), secrets.token_hex(16)
    url = f"http://127.0.0.1:{port}"
    # Runtime files and user settings go to a temporary folder: the test leaves no trace in the home directory.
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
           "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
           "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "settings"), "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "ws")}
    log = open(tmp_path / "lab.log", "w+")
    proc = subprocess.Popen(command + [f"--port={port}", "--ServerApp.port_retries=0",
                                       f"--IdentityProvider.token={token}"],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_until_up(proc, url, token, log)
        auth = {"Authorization": f"token {token}"}

        # The notebook folder is the server's root: it lists every notebook of the repository.
        listing = requests.get(f"{url}/api/contents", headers=auth, timeout=30)
        assert listing.status_code == 200
        served = {item["name"] for item in listing.json()["content"]}
        expected = {p.name for p in NOTEBOOKS.glob("[0-9][0-9]*_*.ipynb")}
        assert expected and expected <= served

        # Each notebook comes back as notebook JSON with its cells (through jupytext's pairing with the .py).
        for name in sorted(expected):
            reply = requests.get(f"{url}/api/contents/{name}", params={"content": 1}, headers=auth, timeout=30)
            assert reply.status_code == 200, f"{name}: {reply.status_code} {reply.text[:500]}"
            model = reply.json()
            assert model["type"] == "notebook" and model["name"] == name
            cells = model["content"]["cells"]
            assert len(cells) > 3 and cells[0]["cell_type"] == "markdown"
            assert "".join(cells[0]["source"]).startswith(f"# {name[:2]} ")

        # The kernel the notebooks name is available, and the JupyterLab page itself is served.
        kernelspecs = requests.get(f"{url}/api/kernelspecs", headers=auth, timeout=30).json()
        assert "python3" in kernelspecs["kernelspecs"]
        page = requests.get(f"{url}/lab", params={"token": token}, timeout=30)
        assert page.status_code == 200 and "jupyter-config-data" in page.text and "JupyterLab" in page.text

        # The token is enforced: without it the API refuses.
        first = sorted(expected)[0]
        assert requests.get(f"{url}/api/contents/{first}", timeout=30).status_code == 403

        # Shut down through the API, as a user's browser would.
        assert requests.post(f"{url}/api/shutdown", headers=auth, timeout=30).status_code in (200, 202)
        proc.wait(timeout=60)
        log.seek(0)
        assert f"http://127.0.0.1:{port}/lab" in log.read(), "the server announces its local address"
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()
