"""The Horovod timeline parser (hvdsync.core.telemetry.timeline) on traces written the way Horovod 0.28.1 writes them."""
import doctest
import json

import pytest

from hvdsync.core.telemetry import timeline


def _trace(records, epoch_us=1_000_000):
    head = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros": epoch_us}},
            {"name": "process_sort_index", "ph": "M", "pid": 0, "args": {"sort_index": 0}}]
    return json.dumps(head + records)


def test_docstring_examples():
    assert doctest.testmod(timeline).failed == 0


def test_negotiation_ranks_activities_and_repeated_tensors_become_spans_in_epoch_seconds():
    recs = [{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "allreduce.fc.weight"}}]
    for base in (0, 1000):
        recs += [{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": base + 10, "pid": 1},
                 {"ph": "X", "name": "0", "ts": base + 10, "pid": 1, "dur": 0},
                 {"ph": "X", "name": "1", "ts": base + 40, "pid": 1, "dur": 0},
                 {"ph": "E", "ts": base + 40, "pid": 1},
                 {"ph": "B", "name": "ALLREDUCE", "ts": base + 50, "pid": 1},
                 {"ph": "B", "name": "QUEUE", "ts": base + 50, "pid": 1}, {"ph": "E", "ts": base + 60, "pid": 1},
                 {"ph": "B", "name": "GLOO_ALLREDUCE", "ts": base + 60, "pid": 1},
                 {"ph": "E", "ts": base + 150, "pid": 1},
                 {"ph": "E", "ts": base + 150, "pid": 1, "args": {"dtype": "float32", "shape": "[4, 4]"}}]
    tl = timeline.parse(_trace(recs))
    assert tl.epoch_start == 1.0 and len(tl.spans) == 2
    first = tl.spans[0]
    assert first.tensor == "allreduce.fc.weight" and first.name == "fc.weight" and first.op == "ALLREDUCE"
    assert first.shape == "[4, 4]"
    assert first.start == pytest.approx(1.00005) and first.seconds == pytest.approx(100e-6)
    assert first.negotiate_start == pytest.approx(1.00001) and first.negotiate_end == pytest.approx(1.00004)
    assert first.ready == {0: pytest.approx(1.00001), 1: pytest.approx(1.00004)}
    assert [a.name for a in first.activities] == ["QUEUE", "GLOO_ALLREDUCE"]
    assert tl.spans[1].start == pytest.approx(1.00105)
    assert timeline.busy_seconds(tl.spans) == pytest.approx(200e-6)
    # Windows covering the first all-reduce fully and none of the second: half hidden.
    assert timeline.overlap(tl.spans, [(0.9, 1.0002)]) == pytest.approx(0.5)
    assert len(tl.select(op="ALLREDUCE", name=lambda n: n.startswith("fc"))) == 2
    assert len(tl.select(between=(1.0009, 2.0))) == 1
    assert tl.select(op="BROADCAST") == []


def test_a_file_cut_in_the_middle_of_a_record_keeps_the_complete_records(tmp_path):
    recs = [{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "g"}},
            {"ph": "B", "name": "ALLREDUCE", "ts": 5, "pid": 1}, {"ph": "E", "ts": 9, "pid": 1},
            {"ph": "B", "name": "ALLREDUCE", "ts": 20, "pid": 1}]
    text = _trace(recs)
    path = tmp_path / "timeline.json"
    path.write_text(text[:-1] + ', {"ph": "E", "ts": 3')
    tl = timeline.read(path)
    assert [(s.tensor, round(s.seconds * 1e6)) for s in tl.spans] == [("g", 4)]
    assert timeline.parse("").spans == []
