"""hvdlab: the teaching and measuring code behind the notebooks and benchmarks (ring and parameter-server
simulations, the communication cost model, hardware probes, staleness simulation, overlap probes, the model split,
the sequential reference, the simulated straggler that tests pass in). It imports :mod:`hvdsync`; :mod:`hvdsync`
never imports it. A distribution of its own (``hvdlab/pyproject.toml``), installed beside hvdsync by
``make install`` and not in hvdsync's wheel; its extra dependencies come with hvdsync's ``notebooks`` extra."""
