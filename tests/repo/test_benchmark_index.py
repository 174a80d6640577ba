"""The benchmark records stay findable: ``benchmarks/results/README.md`` is the index generated from the suites'
``records.json``, it is current, every file under ``benchmarks/results/`` belongs to a record, and ``make bench``
records what it runs under the names the index lists."""
import pathlib
import re

from hvdlab.bench import records

ROOT = pathlib.Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


def test_the_index_is_current():
    assert (RESULTS / records.INDEX).read_text() == records.render(RESULTS), "run: python benchmarks/index.py"


def test_every_result_file_belongs_to_a_record():
    assert [str(p.relative_to(RESULTS)) for p in records.unlisted(RESULTS)] == []


def test_every_record_is_named_by_date_has_files_and_says_how_it_was_made():
    assert records.problems(RESULTS, ROOT) == []
    # One folder per suite, each with its runner beside the results folder.
    suites = records.manifests(RESULTS)
    assert set(suites) == {p.name for p in RESULTS.iterdir() if p.is_dir()}
    assert all(m["runner"] == f"benchmarks/{suite}.py" for suite, m in suites.items()), suites


def test_the_index_lists_each_record_with_its_files(tmp_path):
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "2026-01-02-quiet.txt").write_text("1.00\n")
    (tmp_path / "demo" / "2026-01-02-quiet.json").write_text("{}\n")
    (tmp_path / "demo" / "2026-01-02-quieter.txt").write_text("stray\n")
    (tmp_path / "demo" / "2026-01-03-folder").mkdir()
    (tmp_path / "demo" / "2026-01-03-folder" / "gpu.log").write_text("log\n")
    records.add(tmp_path, "demo", "2026-01-02-quiet", "python benchmarks/allreduce.py", "one line",
                runner="benchmarks/allreduce.py", about="A demo suite.")
    records.add(tmp_path, "demo", "2026-01-03-folder", "bash benchmarks/gpu.sh", "a folder")
    records.write_index(tmp_path)
    index = (tmp_path / records.INDEX).read_text()
    assert "[txt](demo/2026-01-02-quiet.txt)" in index and "[json](demo/2026-01-02-quiet.json)" in index
    assert "[gpu.log](demo/2026-01-03-folder/gpu.log)" in index
    # A name that merely starts like a record's is not one of its files.
    assert records.unlisted(tmp_path) == [tmp_path / "demo" / "2026-01-02-quieter.txt"]
    assert records.problems(tmp_path, ROOT) == []
    records.add(tmp_path, "demo", "2026-01-02-quiet", "python benchmarks/nothing.py", "")
    assert len(records.problems(tmp_path, ROOT)) == 2  # no line, and a command naming no script that exists


def test_make_bench_records_each_suite_it_runs():
    recipe = re.search(r"^bench:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M).group(1)
    runs = [line for line in recipe.splitlines() if "benchmarks/" in line]
    assert runs
    for line in runs:
        script = re.search(r"benchmarks/(\w+)\.py", line).group(1)
        if script == "index":
            continue
        # Each run keeps its output as <date>[-<part>]-make-bench in its suite's folder, listed in the index (the
        # runner regenerates it): no file of its own naming, nothing outside benchmarks/results/<suite>/.
        assert "--record make-bench" in line, line
        assert "--json" not in line and "--md" not in line, line
        assert (RESULTS / script / records.MANIFEST).exists(), script
