"""The notebooks: paired with their jupytext scripts, committed without outputs, one guide section each, workers
launched only through hvdsync, and every one executed from top to bottom (nbclient, kernel ``python3``, real Horovod
workers) within its time limit.

Executed copies are written to pytest's ``tmp_path`` (kept for the last runs) for looking at a failure, and, once a
notebook has passed, to ``build/notebooks/`` with the hash of its source and its runtime: ``make docs`` renders those
copies instead of executing every notebook again (scripts/docs/executed.py).
"""
from __future__ import annotations

import difflib
import re
import shutil
import time
from pathlib import Path

import jupytext
import nbformat
import pytest
from nbclient import NotebookClient

from scripts.docs import executed

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
# NN_topic, or NNa_topic, NNb_topic, ... where one guide section is split into parts (a learner reads each in one go).
NAME = re.compile(r"^(\d\d)([a-z])?_[a-z0-9_]+$")
EXECUTED = executed.EXECUTED  # the executed copies make docs renders

# The guide's section headings, verbatim, with their English translations: a copy of the guide's list kept beside the
# notebooks (the guide itself is not in the repository).
HEADINGS_FILE = NOTEBOOKS / "guide_headings.txt"
CHINESE_NUMERALS = "一二三四五六七八九十"


def read_headings(path: Path = HEADINGS_FILE) -> dict[str, tuple[str, str]]:
    """{"NN": (the heading as the guide writes it, its English translation)} from the tab-separated headings file."""
    headings = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            number, chinese, english = line.split("\t")
            headings[number] = (chinese, english)
    return headings


def chinese_number(n: int) -> str:
    """1 -> 一, 10 -> 十, 12 -> 十二, 18 -> 十八: how the guide numbers its sections (1-19)."""
    return CHINESE_NUMERALS[n - 1] if n <= 10 else "十" + CHINESE_NUMERALS[n - 11]


def expected_title(stem: str, headings: dict[str, tuple[str, str]], parts: int = 1) -> str:
    """The first line a notebook's title cell must have: its section's heading exactly, a part label if split."""
    number = _number(stem)
    chinese, english = headings[number]
    title = f"# {number} · {chinese} — {english}"
    if parts > 1:
        title += f" ({ord(_part(stem)) - ord('a') + 1}/{parts})"
    return title


# Wall-clock limit per notebook, in seconds (also nbclient's per-cell limit). Each notebook targets < 90 s on a quiet
# 2-core machine; the limits leave room for other jobs sharing the cores (timings were 35-100 s under load 4-8).
TIMEOUTS = {"01": 240, "02": 240, "03": 240, "04": 300, "05": 300, "06": 300, "07": 300, "08": 360, "09": 300, "10": 480,
            "11": 300, "12": 300, "13": 300, "14": 300, "15": 400, "16": 600, "17": 480, "18": 300}
DEFAULT_TIMEOUT = 300

# Notebooks the suite does not execute, each with its reason. Empty: every notebook runs.
NOT_EXECUTED: dict[str, str] = {}

# Ways of starting processes that a notebook must not use: workers are started by hvdsync.launch.local.
SHELLING_OUT = re.compile(r"subprocess|os\.system|os\.popen|Popen|horovodrun|mpirun|^\s*!|^%%(ba)?sh|%system|"
                          r"get_ipython\(\)\.system", re.M)


def _stems(pattern: str) -> set[str]:
    return {p.stem for p in NOTEBOOKS.glob(pattern) if NAME.match(p.stem)}


STEMS = sorted(_stems("[0-9][0-9]*_*.ipynb") | _stems("[0-9][0-9]*_*.py"))


def _number(stem: str) -> str:
    return NAME.match(stem).group(1)


def _part(stem: str) -> str | None:
    return NAME.match(stem).group(2)


def section_problems(stems: list[str]) -> list[str]:
    """What breaks "one guide section per number": a number with a plain notebook beside parts, or parts that do
    not run a, b, c, ... without a gap or a repeat (empty: fine)."""
    by_number: dict[str, list] = {}
    for stem in stems:
        by_number.setdefault(_number(stem), []).append(_part(stem))
    problems = []
    for number, parts in sorted(by_number.items()):
        if parts == [None]:
            continue
        expected = [chr(ord("a") + i) for i in range(len(parts))]
        if sorted(parts, key=str) != expected:
            problems.append(f"{number}: parts {sorted(map(str, parts))}; expected one notebook {number}_topic, or "
                            f"parts {', '.join(number + p for p in expected)}")
    return problems


def _read_ipynb(stem: str) -> nbformat.NotebookNode:
    return nbformat.read(NOTEBOOKS / f"{stem}.ipynb", as_version=4)


def _code(nb: nbformat.NotebookNode) -> str:
    return "\n".join(c.source for c in nb.cells if c.cell_type == "code")


def pair_differences(ipynb: Path, script: Path) -> list[str]:
    """What differs between a notebook's cells and jupytext's reading of its paired script (empty: in sync)."""
    left = [(c.cell_type, c.source) for c in nbformat.read(ipynb, as_version=4).cells]
    right = [(c.cell_type, c.source) for c in jupytext.read(script).cells]
    problems = []
    if len(left) != len(right):
        problems.append(f"{ipynb.name} has {len(left)} cells, {script.name} has {len(right)}")
    for i, ((kind_a, source_a), (kind_b, source_b)) in enumerate(zip(left, right)):
        if kind_a != kind_b:
            problems.append(f"cell {i}: {kind_a} in {ipynb.name}, {kind_b} in {script.name}")
        elif source_a != source_b:
            lines = [line for line in difflib.unified_diff(source_a.splitlines(), source_b.splitlines(), lineterm="",
                                                           n=0) if line[:1] in "+-" and line[:3] not in ("+++", "---")]
            problems.append(f"cell {i} differs (- {ipynb.name}, + {script.name}): " + " | ".join(lines[:4]))
    return problems


# ---- pairing ------------------------------------------------------------------------------------------------------
def test_there_are_notebooks_and_each_has_its_pair():
    assert {"01", "02", "05", "06", "12"} <= {_number(s) for s in STEMS}
    assert _stems("[0-9][0-9]*_*.ipynb") == _stems("[0-9][0-9]*_*.py"), "every NN_topic.ipynb needs NN_topic.py"
    assert section_problems(STEMS) == [], "one guide section per number, split into parts a, b, ... if at all"


def test_the_section_check_catches_a_duplicate_number_and_a_gap_in_the_parts():
    assert section_problems(["01_goals", "12a_practices", "12b_mistakes"]) == []
    assert section_problems(["01_goals", "01_other"]) != []
    assert section_problems(["12_practices", "12a_practices"]) != []
    assert section_problems(["12a_practices", "12c_mistakes"]) != []
    assert section_problems(["12a_practices", "12a_mistakes"]) != []


@pytest.mark.parametrize("stem", STEMS)
def test_notebook_and_script_have_the_same_cells(stem):
    problems = pair_differences(NOTEBOOKS / f"{stem}.ipynb", NOTEBOOKS / f"{stem}.py")
    assert problems == [], f"{stem}: out of sync; run `jupytext --sync notebooks/{stem}.py`\n" + "\n".join(problems)


def test_the_pair_check_catches_an_edited_script_and_an_added_cell(tmp_path):
    stem = STEMS[0]
    ipynb, script = tmp_path / f"{stem}.ipynb", tmp_path / f"{stem}.py"
    shutil.copy(NOTEBOOKS / f"{stem}.ipynb", ipynb)
    text = (NOTEBOOKS / f"{stem}.py").read_text()
    assert pair_differences(ipynb, NOTEBOOKS / f"{stem}.py") == []
    script.write_text(text.replace("import numpy as np", "import numpy as numpy", 1))
    assert any("import numpy as np" in p for p in pair_differences(ipynb, script))
    script.write_text(text + "\n# %%\nprint('a new cell')\n")
    assert any("cells" in p for p in pair_differences(ipynb, script))


# ---- what is committed --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("stem", STEMS)
def test_committed_without_outputs_and_paired_for_jupytext(stem):
    nb = _read_ipynb(stem)
    nbformat.validate(nb)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{stem} cell {i}: clear its outputs"
    assert nb.metadata["jupytext"]["formats"] == "ipynb,py:percent"
    assert nb.metadata["kernelspec"]["name"] == "python3"


def test_the_headings_file_lists_the_guides_18_sections_in_order():
    headings = read_headings()
    assert list(headings) == [f"{n:02d}" for n in range(1, 19)]
    for number, (chinese, english) in headings.items():
        # The guide numbers its sections 一、... 十八、; a heading without its numeral was typed by hand, not copied.
        assert chinese.startswith(chinese_number(int(number)) + "、"), chinese
        assert english and english.isascii(), english
    assert {_number(s) for s in STEMS} == set(headings), "one notebook (or one set of parts) per guide section"


def test_the_title_check_wants_the_heading_exactly_and_a_part_label_only_for_parts():
    headings = {"05": ("五、精通基于集合通信的环同步算法", "Ring"), "12": ("十二、遵循主流框架的最佳实践与配置", "Practices")}
    assert expected_title("05_ring", headings) == "# 05 · 五、精通基于集合通信的环同步算法 — Ring"
    assert expected_title("12b_mistakes", headings, parts=2) == "# 12 · 十二、遵循主流框架的最佳实践与配置 — Practices (2/2)"
    assert chinese_number(1) == "一" and chinese_number(10) == "十" and chinese_number(17) == "十七"


@pytest.mark.parametrize("stem", STEMS)
def test_notebook_follows_its_guide_section(stem):
    nb = _read_ipynb(stem)
    number = _number(stem)
    headings = read_headings()
    assert number in headings, f"{stem}: section {number} is not among the guide's headings in {HEADINGS_FILE.name}"
    parts = sum(1 for s in STEMS if _number(s) == number)
    title = nb.cells[0]
    assert title.cell_type == "markdown"
    first_line = title.source.splitlines()[0]
    assert first_line == expected_title(stem, headings, parts), f"{stem}: the title must be the guide's heading"
    assert len(title.source) > 500, "the title cell explains the idea"
    # The box: the section's own points, numbered in the guide's order, each with where the notebook shows it (->).
    assert "**The guide's section, point by point**" in title.source, f"{stem}: the title cell lacks the guide's box"
    points = re.findall(r"^> (\d+)\. (.*(?:\n>    .*)*)", title.source, re.M)
    assert [int(n) for n, _ in points] == list(range(1, len(points) + 1)) and len(points) >= 3, f"{stem}: box points"
    assert all("→" in text for _, text in points), f"{stem}: every point of the box says where it is shown"
    last = nb.cells[-1]
    assert last.cell_type == "markdown" and last.source.startswith("## What to take away")
    code = _code(nb)
    assert re.search(r"^from hvdsync|^import hvdsync", code, re.M), "notebooks show hvdsync at work"
    assert "plt." in code and "print(" in code
    assert "assert " in code, "a notebook checks the claims it makes on the numbers it measured"


PREDICT = "**Predict, then run.**"
GUESS = re.compile(r"^my_prediction = None\b", re.M)


def exercise_problems(nb: nbformat.NotebookNode) -> list[str]:
    """What a notebook's "predict, then run" exercise lacks: the question in a markdown cell, then a code cell that
    is only the reader's guess (``my_prediction = None``), then a code cell that measures and prints the guess beside
    the measured figure."""
    cells = nb.cells
    asked = [i for i, c in enumerate(cells) if c.cell_type == "markdown" and PREDICT in c.source]
    if not asked:
        return [f"no markdown cell asks {PREDICT!r}"]
    problems = []
    for i in asked:
        guess = next((j for j in range(i + 1, len(cells)) if cells[j].cell_type == "code"), None)
        if guess is None or not GUESS.search(cells[guess].source) or len(cells[guess].source.splitlines()) != 1:
            problems.append(f"cell {i}: the next code cell must be only `my_prediction = None   # ...`")
            continue
        answer = cells[guess + 1] if guess + 1 < len(cells) else None
        if answer is None or answer.cell_type != "code" or "my_prediction" not in answer.source \
                or "print(" not in answer.source:
            problems.append(f"cell {guess}: the cell after the guess must measure and print it beside the figure")
    return problems


@pytest.mark.parametrize("stem", STEMS)
def test_notebook_has_a_predict_then_run_exercise(stem):
    assert exercise_problems(_read_ipynb(stem)) == [], stem


def test_the_exercise_check_catches_a_missing_question_guess_or_answer():
    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    ask, guess = md(f"{PREDICT} How many?"), code("my_prediction = None   # e.g. 2")
    answer = code("x = 4\nprint(f'your prediction: {my_prediction}; measured: {x}')")
    whole = nbformat.v4.new_notebook(cells=[ask, guess, answer])
    assert exercise_problems(whole) == []
    assert exercise_problems(nbformat.v4.new_notebook(cells=[guess, answer])) != []
    assert exercise_problems(nbformat.v4.new_notebook(cells=[ask, answer])) != []
    assert exercise_problems(nbformat.v4.new_notebook(cells=[ask, guess, code("x = 4\nprint(x)")])) != []
    assert exercise_problems(nbformat.v4.new_notebook(cells=[ask, guess])) != []


# A prediction is named by its guess cell's variable (``my_prediction``). A cell answers it when its code uses that
# name (the cell that prints the guess beside the measurement) or when it carries the marker ``answers:
# my_prediction`` (a comment in code, ``<!-- answers: my_prediction -->`` in markdown, invisible once rendered): put
# the marker on every other cell that shows the answer (a chart of the measured figure, a table of it).
GUESS_NAME = re.compile(r"^(my_prediction\w*) = None\b", re.M)


def _answers(cell: nbformat.NotebookNode, name: str) -> bool:
    marked = re.search(rf"answers: {re.escape(name)}\b", cell.source) is not None
    used = cell.cell_type == "code" and re.search(rf"\b{re.escape(name)}\b", cell.source) is not None
    return marked or used


def answer_order_problems(nb: nbformat.NotebookNode) -> list[str]:
    """Cells that answer a prediction before it is asked (empty: every question comes first). The question is the
    markdown cell asking ``PREDICT`` before the prediction's guess cell."""
    cells = nb.cells
    problems = []
    for guess, cell in enumerate(cells):
        found = GUESS_NAME.search(cell.source) if cell.cell_type == "code" else None
        if not found:
            continue
        name = found.group(1)
        asked = max((i for i in range(guess) if cells[i].cell_type == "markdown" and PREDICT in cells[i].source),
                    default=None)
        if asked is None:
            problems.append(f"cell {guess}: {name} is guessed without a question before it")
            continue
        answering = [i for i, c in enumerate(cells) if i != guess and _answers(c, name)]
        if not [i for i in answering if i > guess]:
            problems.append(f"{name}: no cell after the guess answers it")
        problems += [f"cell {i} answers {name} before the question (cell {asked})" for i in answering if i < asked]
    return problems


@pytest.mark.parametrize("stem", STEMS)
def test_every_prediction_is_asked_before_the_cells_that_answer_it(stem):
    assert answer_order_problems(_read_ipynb(stem)) == [], stem


def test_the_order_check_catches_an_answer_moved_before_its_question():
    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    ask, guess = md(f"{PREDICT} How many?"), code("my_prediction = None   # e.g. 2")
    answer = code("x = 4\nprint(f'your prediction: {my_prediction}; measured: {x}')")
    chart = code("# answers: my_prediction\nplt.plot([x]); plt.show()")
    spoiler = md("Rank 1 waits 4 ms.\n<!-- answers: my_prediction -->")
    assert answer_order_problems(nbformat.v4.new_notebook(cells=[ask, guess, answer, chart, spoiler])) == []
    assert answer_order_problems(nbformat.v4.new_notebook(cells=[chart, ask, guess, answer])) != []
    assert answer_order_problems(nbformat.v4.new_notebook(cells=[spoiler, ask, guess, answer])) != []
    assert answer_order_problems(nbformat.v4.new_notebook(cells=[ask, guess])) != []   # nothing answers it
    # A real notebook, its marked chart moved above the question: the check fails on the reordered copy.
    nb = _read_ipynb("07_overlap_communication")
    assert answer_order_problems(nb) == []
    marked = next(i for i, c in enumerate(nb.cells) if "answers: my_prediction" in c.source)
    asked = next(i for i, c in enumerate(nb.cells) if PREDICT in c.source)
    nb.cells.insert(asked, nb.cells.pop(marked))
    assert any("before the question" in p for p in answer_order_problems(nb))


@pytest.mark.parametrize("stem", STEMS)
def test_workers_are_started_only_through_hvdsync(stem):
    code = _code(_read_ipynb(stem))
    assert re.search(r"launch\.(run|train|train_many)\(", code), f"{stem}: start Horovod workers with hvdsync.launch.local"
    assert not SHELLING_OUT.search(code), f"{stem}: {SHELLING_OUT.search(code).group(0)!r}: no hand-built commands"


# ---- execution ----------------------------------------------------------------------------------------------------
def _outputs(nb):
    for cell in nb.cells:
        if cell.cell_type == "code":
            yield from cell.outputs


def _timed_params():
    params = []
    for stem in STEMS:
        limit = TIMEOUTS.get(_number(stem), DEFAULT_TIMEOUT)
        marks = [pytest.mark.timeout(limit + 120)]
        if stem in NOT_EXECUTED:
            marks.append(pytest.mark.skip(reason=NOT_EXECUTED[stem]))
        params.append(pytest.param(stem, limit, marks=marks, id=stem))
    return params


def _drawn(png_base64: str) -> bool:
    """Whether a PNG chart has something on it: a blank figure is one flat colour."""
    import base64
    import io

    import matplotlib.image

    pixels = matplotlib.image.imread(io.BytesIO(base64.b64decode(png_base64)), format="png")
    return float(pixels[..., :3].std()) > 0.01


@pytest.mark.parametrize("stem,limit", _timed_params())
def test_notebook_executes_and_shows_measured_numbers_and_a_plot(stem, limit, tmp_path, monkeypatch):
    # Figures must come back as image/png: the kernel uses matplotlib's inline backend unless MPLBACKEND says not to.
    monkeypatch.delenv("MPLBACKEND", raising=False)
    nb = _read_ipynb(stem)
    client = NotebookClient(nb, timeout=limit, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOKS)}})
    start = time.perf_counter()
    try:
        client.execute()
    finally:
        nbformat.write(nb, tmp_path / f"{stem}.executed.ipynb")
    elapsed = time.perf_counter() - start
    assert elapsed < limit, f"{stem} took {elapsed:.0f} s (limit {limit} s)"

    outputs = list(_outputs(nb))
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if o.output_type == "display_data" and "image/png" in o.get("data", {})]
    assert images, f"{stem}: no matplotlib figure was shown"
    # Each plt.show() of a cell shows a chart with something drawn on it. A figure made in one cell and filled in the
    # next is shown half-empty by the first (the inline backend shows and closes figures at the end of a cell) and
    # not at all by the second: this finds it.
    for i, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
        shown = [o for o in cell.outputs if o.output_type == "display_data" and "image/png" in o.get("data", {})]
        assert len(shown) >= cell.source.count("plt.show()"), f"{stem}: code cell {i + 1} lost a chart"
        assert all(_drawn(o["data"]["image/png"]) for o in shown), f"{stem}: code cell {i + 1} showed a blank chart"
    printed = "".join(o.text for o in outputs if o.output_type == "stream" and o.name == "stdout")
    assert re.search(r"\d+\.\d+", printed), f"{stem}: no measured number was printed"
    # Every code cell ran, in order (a skipped cell would leave execution_count empty).
    counts = [c.execution_count for c in nb.cells if c.cell_type == "code"]
    assert counts == list(range(1, len(counts) + 1))
    _keep_executed(stem, nb, elapsed)


def _keep_executed(stem: str, nb: nbformat.NotebookNode, seconds: float) -> None:
    """Keep a passed notebook's executed copy for the documentation site, tagged with what it was executed from."""
    executed.keep(nb, NOTEBOOKS / f"{stem}.ipynb", seconds, EXECUTED)
