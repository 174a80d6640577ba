"""The MLflow UI as a user meets it after hvdsync's jobs: two runs and a sweep in a fresh store, served by
``hvdsync runs ui``, opened in headless chromium (the same driver as ``make docs-check``, scripts/docs/check.py).

Checks, in the browser:

* the link ``runs ui`` prints opens the experiment on its runs (the runs table with the runs' names), not MLflow's
  GenAI overview (no page shows the GenAI navigation);
* a run's overview names who ran it and its data set;
* a run's metric charts start with the ``Key`` section (``Key/samples_per_second`` ...), before "Model metrics";
* a run's artifacts show ``training.png`` at the root;
* the compare view of the two runs shows the key figures and the training plot of each (common artifacts).

Writes screenshots (experiment, run, run-metrics, compare, compare-artifacts) and summary.json to ``--out``
(default docs/measurements/tracking, shown in docs/tracking.md).

    python -m scripts.tracking_check [--out docs/measurements/tracking] [--keep STORE_FOLDER]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HVDSYNC = [sys.executable, "-m", "hvdsync.launch.cli"]
# What the UI must show, waited for in the page's text (MLflow's UI renders after its API calls return).
WAIT_S = 60


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_store(folder: Path) -> str:
    """Two standalone runs (none and fp16) and a 2-point sweep, each a real 2-worker job of 2 epochs (1 for the sweep)."""
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    common = ["--np", "2", "--tracking-uri", uri, "--experiment", "check", "--set", f"tracking.spool_dir={folder}/spool"]
    for compression in ("none", "fp16"):
        subprocess.run([*HVDSYNC, "train", "--epochs", "2", "--compression", compression, *common], check=True,
                       cwd=folder)
    subprocess.run([*HVDSYNC, "sweep", "--epochs", "1", "--set", "sync.accumulate=1,2", *common], check=True,
                   cwd=folder)
    return uri


def text_of(driver) -> str:
    """The page's text, each run of whitespace one space (a heading and its count are separate elements)."""
    return " ".join((driver.execute_script("return document.body ? document.body.innerText : ''") or "").split())


def wait_for_text(driver, needles: list[str], timeout: float = WAIT_S) -> tuple[str, list[str]]:
    """The page's text once every needle is in it, or at the timeout with the needles still missing."""
    deadline, text = time.monotonic() + timeout, ""
    while time.monotonic() < deadline:
        text = text_of(driver)
        missing = [n for n in needles if n not in text]
        if not missing:
            return text, []
        time.sleep(0.5)
    return text, [n for n in needles if n not in text]


# Text only MLflow's GenAI navigation shows (its "Model training" one shows Runs and Models).
GENAI_ONLY = ("Evaluation runs", "Prompts & versions")
ML = "workflowType=machine_learning"
SCROLL_TO_TEXT_JS = """
const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
while (walker.nextNode()) {
  if (walker.currentNode.textContent.includes(arguments[0])) {
    walker.currentNode.parentElement.scrollIntoView({block: 'start'}); window.scrollBy(0, -40); return true;
  }
}
return false;
"""


def check(driver, url: str, uri: str, out: Path) -> dict:
    import getpass

    import mlflow
    from selenium.webdriver.common.by import By

    from scripts.docs.check import screenshot

    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name("check")
    runs = client.search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"])
    standalone = [r for r in runs if "mlflow.parentRunId" not in r.data.tags
                  and r.data.tags.get("hvdsync.launcher") != "sweep"][:2]
    base = url.split("#")[0].rstrip("/")
    failures, pages = [], {}

    def visit(name: str, page: str, needles: list[str], scroll_to_text: str | None = None,
              click_text: str | None = None, shot: bool = True) -> str:
        driver.get(page)
        text, missing = wait_for_text(driver, needles)
        if click_text:  # an artifact opened in the preview
            for element in driver.find_elements(By.XPATH, f"//*[text()='{click_text}']")[:2]:
                driver.execute_script("arguments[0].scrollIntoView({block: 'center'}); arguments[0].click();", element)
                time.sleep(3)
        if scroll_to_text:
            driver.execute_script(SCROLL_TO_TEXT_JS, scroll_to_text)
            time.sleep(1)
        text = text_of(driver)
        pages[name] = {"url": page, "missing": missing}
        failures.extend(f"{name}: {needle!r} not on the page" for needle in missing)
        failures.extend(f"{name}: MLflow's GenAI view ({genai!r} in its navigation)" for genai in GENAI_ONLY
                        if genai in text)
        if shot:
            screenshot(driver, out / f"{name}.png", None, 0.8, 128)
        return text

    names = [r.info.run_name for r in standalone]
    if ML not in url:
        failures.append(f"experiment: runs ui printed {url}, not a link to the runs as model training")
    visit("experiment", url, ["Runs", *names])
    run = standalone[-1]
    run_page = f"{base}/#/experiments/{exp.experiment_id}/runs/{run.info.run_id}"
    visit("run", f"{run_page}?{ML}", [run.info.run_name, getpass.getuser(), "digits", "Model training"])
    text = visit("run-metrics", f"{run_page}/model-metrics?{ML}", ["Key (", "samples_per_second", "comm_share"])
    # The chart sections as MLflow heads them after its toolbar, "Key (15)", "step (9)", ..., in page order.
    sections = re.findall(r"(\w+) \((\d+)\)", text.split("Auto-refresh", 1)[-1])
    if not sections or sections[0][0] != "Key":
        failures.append(f"run-metrics: the first chart section is {sections[:1]}, not Key")
    # No screenshot: MLflow shows the artifact's local path there, which names this machine's folders.
    visit("run-artifacts", f"{run_page}/artifacts?{ML}", ["training.png", "hvdsync"], click_text="training.png",
          shot=False)
    ids = json.dumps([r.info.run_id for r in standalone])
    compare = f"{base}/#/compare-runs?runs={ids}&experiments={json.dumps([exp.experiment_id])}&{ML}"
    visit("compare", compare, [*names, "Key/samples_per_second", "Key/comm_share"],
          scroll_to_text="Key/comm_share")
    text = visit("compare-artifacts", compare, ["training.png"], scroll_to_text="Artifacts",
                 click_text="training.png")
    if "No common artifacts" in text:
        failures.append("compare-artifacts: MLflow finds no common artifacts")
    return {"pages": pages, "failures": failures, "runs": names,
            "sections": [f"{name} ({n})" for name, n in sections[:4]]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "measurements" / "tracking")
    parser.add_argument("--keep", type=Path, help="make the store in this folder and keep it (default: a temporary one)")
    args = parser.parse_args(argv)
    from scripts.docs.check import browser

    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        # A kept folder that has its store already is reused (checking the UI again without training again).
        uri = f"sqlite:///{folder / 'mlflow.db'}" if (folder / "mlflow.db").exists() else make_store(folder)
        port = _free_port()
        ui = subprocess.Popen([*HVDSYNC, "runs", "ui", "--tracking-uri", uri, "--port", str(port),
                               "--experiment", "check"], stdout=subprocess.PIPE, text=True, start_new_session=True)
        driver = None
        try:
            line = ui.stdout.readline().strip()          # printed once the server answers
            if not line.startswith("MLflow UI on "):
                print(f"tracking-check: runs ui did not start ({line!r})", file=sys.stderr)
                return 1
            url = line.removeprefix("MLflow UI on ").split(" ")[0]
            args.out.mkdir(parents=True, exist_ok=True)
            driver = browser()
            driver.set_window_size(1600, 1000)
            summary = check(driver, url, uri, args.out)
            version = driver.capabilities.get("browserVersion", "?")
        finally:
            if driver is not None:
                driver.quit()
            os.killpg(ui.pid, signal.SIGTERM)             # runs ui stops its server's group on SIGTERM
            ui.wait(timeout=60)
    summary.update(checked_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), browser=f"chromium {version}",
                   seconds=round(time.perf_counter() - start, 1), command="make tracking-check")
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"tracking-check: {len(summary['pages'])} pages in chromium {version}, {summary['seconds']} s; "
          f"{len(summary['failures'])} failures")
    for failure in summary["failures"]:
        print(f"FAIL {failure}")
    return 1 if summary["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
