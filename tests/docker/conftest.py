"""Opt-in: the tests here build and run the Docker images (a Docker engine, minutes). They carry the `docker` marker
and are deselected unless the marker is asked for: `make docker-test` (`pytest -m docker tests/docker`)."""


def pytest_collection_modifyitems(config, items):
    if "docker" in (config.getoption("markexpr") or ""):
        return
    skipped = [item for item in items if item.get_closest_marker("docker")]
    if skipped:
        config.hook.pytest_deselected(items=skipped)
        items[:] = [item for item in items if not item.get_closest_marker("docker")]
