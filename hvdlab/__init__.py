"""hvdlab: the teaching and measuring code behind the notebooks and benchmarks (ring and parameter-server
simulations, the communication cost model, hardware probes, staleness simulation, overlap probes, the model split,
the sequential reference, the simulated straggler that tests pass in). It imports :mod:`hvdsync`; :mod:`hvdsync`
never imports it. Installed with hvdsync, its extra dependencies come with the ``notebooks`` extra."""
