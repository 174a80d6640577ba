"""Opt-in: the tests here build and run the Docker images (a Docker engine, minutes). They carry the `docker` marker
and are deselected unless the marker is asked for: `make docker-test` (`pytest -m docker tests/docker`)."""
import os

import pytest

from tests.conftest import BUILD_CACHE


def pytest_collection_modifyitems(config, items):
    if "docker" in (config.getoption("markexpr") or ""):
        return
    skipped = [item for item in items if item.get_closest_marker("docker")]
    if skipped:
        config.hook.pytest_deselected(items=skipped)
        items[:] = [item for item in items if not item.get_closest_marker("docker")]


@pytest.fixture(autouse=True, scope="session")
def _horovod_wheel_cache():
    """The images take the wheels scripts/build_horovod.sh cached, as `make docker-cpu` does: the suite's own home
    (tests/conftest.py) has none, and building Horovod again in each image takes its full compile time."""
    saved = os.environ.get("HVDSYNC_CACHE")
    os.environ["HVDSYNC_CACHE"] = BUILD_CACHE
    yield
    if saved is None:
        os.environ.pop("HVDSYNC_CACHE", None)
    else:
        os.environ["HVDSYNC_CACHE"] = saved
