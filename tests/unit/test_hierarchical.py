"""The hierarchical all-reduce's bookkeeping (hvdlab.bench.hierarchical, benchmarks/hierarchical.py): which ranks
form each host's set and the leaders', the ring formulas, and a rate's row from the workers' figures. The all-reduce
itself runs on test hosts in tests/hosts/test_jobs.py."""
import pytest

from hvdlab.bench import hierarchical
from tests import benchmark_scripts


def test_host_sets_group_ranks_by_host_and_lead_with_the_lowest():
    assert hierarchical.host_sets(["a", "a", "b", "b"]) == ([[0, 1], [2, 3]], [0, 2])
    assert hierarchical.host_sets(["a", "b", "a"]) == ([[0, 2], [1]], [0, 1])
    assert hierarchical.host_sets(["a"]) == ([[0]], [0])


def test_the_ring_formulas():
    assert hierarchical.flat_link_buffers(4) == 1.5
    assert hierarchical.flat_link_buffers(2) == 1.0
    assert hierarchical.hierarchical_link_buffers(2) == 1.0
    assert hierarchical.hierarchical_link_buffers(4) == 1.5
    assert hierarchical.hierarchical_link_buffers(1) == 0.0


def _rank(rank, leader, flat_s, hier_s, flat_tx, hier_tx):
    return {"rank": rank, "leader": leader, "buffer_bytes": 100, "rounds": 2, "max_err": 1e-6,
            "flat": {"seconds": flat_s, "tx_bytes": flat_tx, "rx_bytes": flat_tx},
            "hierarchical": {"seconds": hier_s, "tx_bytes": hier_tx, "rx_bytes": hier_tx}}


def test_a_row_takes_the_slowest_rank_of_each_repeat_then_the_median():
    bench = benchmark_scripts.load("hierarchical")
    by_rank = [_rank(0, True, [1.0, 3.0, 2.0], [0.5, 0.9, 0.7], 300, 200),
               _rank(1, False, [1.5, 1.0, 1.0], [0.6, 0.4, 0.4], 0, 0)]
    row = bench.summarise(by_rank, "1gbit", 1.2e8)
    assert row["flat"]["seconds"] == 2.0 and row["flat"]["spread"] == [1.5, 3.0] and row["flat"]["repeats"] == 3
    assert row["hierarchical"]["seconds"] == 0.7 and row["hierarchical"]["spread"] == [0.6, 0.9]
    assert row["ratio"] == pytest.approx(0.35)
    assert row["flat"]["link_buffers"] == 1.5 and row["hierarchical"]["link_buffers"] == 1.0
    assert row["link_MBps"] == 120.0


@pytest.mark.parametrize("argv,named", [(["--rates", "fast"], "fast"), (["--repeats", "0"], "--repeats 0")])
def test_bad_options_are_refused_by_name(argv, named, capsys):
    bench = benchmark_scripts.load("hierarchical")
    with pytest.raises(SystemExit) as stop:
        bench.main(argv)
    assert stop.value.code == 2 and named in capsys.readouterr().err
