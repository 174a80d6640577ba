"""The parameter server's assertions, the same for both frameworks (tests/parallel/test_schemes.py for PyTorch,
test_tf_schemes.py for TensorFlow): each framework's workers return the same keys, so one set of checks and
tolerances holds both to the ring and to the numpy simulation."""
import numpy as np
import pytest

from hvdsync.core.comm.schemes import ps


def max_diff(a, b):
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b))


def reach_the_ring(runs: dict) -> None:
    """Sharded and single-server runs end within 1e-5 of the ring's parameters, every rank the same; fp16 close."""
    ring = runs["allreduce"]["params"]
    assert runs["allreduce"]["accuracy"] > 0.85                     # it trained
    for name in ("ps_sharded", "ps_single"):
        assert runs[name]["steps"] == runs["allreduce"]["steps"] > 40
        assert max_diff(runs[name]["params"], ring) < 1e-5, name
        assert runs[name]["spread"] == 0.0                          # every rank pulled the same parameters
    assert 1e-6 < max_diff(runs["ps_fp16"]["params"], ring) < 5e-2  # fp16 pushes: close, not equal
    assert runs["ps_fp16"]["wire"]["dtypes"] == ["float16"]


def bytes_counted(runs: list[dict]) -> None:
    """Bytes through each rank (``runs``: every rank's runs) for the single server, the shards and the ring."""
    steps = runs[0]["allreduce"]["steps"]
    payload = runs[0]["allreduce"]["wire"]["bytes"] / steps        # gradient bytes one rank hands over per step
    assert runs[0]["ps_sharded"]["wire"]["bytes"] == runs[0]["allreduce"]["wire"]["bytes"]
    single0, single1 = runs[0]["ps_single"]["traffic"], runs[1]["ps_single"]["traffic"]
    # The server receives W-1 gradients per step and sends W-1 copies of the parameters; a worker one of each.
    assert single0["received"] == single0["sent"] == (2 - 1) * payload * steps
    assert single1["received"] == single1["sent"] == payload * steps
    # Sharded: each rank sends (W-1)/W of the push and of the pull: 2 (W-1)/W S per step, the ring's law.
    for r in runs:
        assert r["ps_sharded"]["traffic"]["sent"] == pytest.approx(2 * (2 - 1) / 2 * payload * steps, rel=0.01)
    # With W = 2 the single server moves 1x (= W - 1) a sharded rank's bytes; the W = 4, 8 ratios are in the
    # numpy tests (tests/unit/test_schemes.py), counted the same way (hvdsync.core.comm.schemes.ps.traffic).
    assert single0["sent"] + single0["received"] == pytest.approx(
        (2 - 1) * (runs[0]["ps_sharded"]["traffic"]["sent"] + runs[0]["ps_sharded"]["traffic"]["received"]), rel=0.01)


def rounds_match_the_simulation(checks: list[dict]) -> None:
    """One round with every rank a server (``ps0``) and with one server (``ps1``) equals the numpy simulation at
    W = 2, parameters and counted bytes alike (18 float32 elements)."""
    for key, servers in (("ps0", 0), ("ps1", 1)):
        rounds = [r["rounds"][key] for r in checks]
        expected, _ = ps.ps_round([r["grad"] for r in rounds], rounds[0]["start"], servers,
                                  lambda _s, p, g: p - 0.5 * g)
        for rank, r in enumerate(rounds):
            np.testing.assert_allclose(r["after"], expected[rank], atol=1e-5)
            assert r["traffic"]["sent"] == ps.traffic(18, 4, 2, servers).sent[rank]
            assert r["traffic"]["received"] == ps.traffic(18, 4, 2, servers).received[rank]
