"""hvdsync.torch.runtime.wait: blocks in hvd.synchronize where the installed Horovod has patch 0005, else polls."""
import sys
from pathlib import Path

import pytest

hvd = pytest.importorskip("horovod.torch")

from hvdsync.torch import runtime  # noqa: E402


def test_a_library_without_the_wait_is_polled():
    assert runtime.synchronize_blocks("_ZN7horovod5torch13HandleManager13NoSuchHandleEi") is False


@pytest.mark.skipif(not (Path(sys.prefix) / "hvdsync-horovod-build-key").exists(),
                    reason="Horovod not built by scripts/build_horovod.sh")
def test_hvdsyncs_build_blocks():
    assert runtime.synchronize_blocks() is True


@pytest.mark.parametrize("blocks", [True, False])
def test_both_waits_return_the_reduced_tensor(monkeypatch, blocks):
    import torch

    hvd.init()
    monkeypatch.setattr(runtime, "synchronize_blocks", lambda: blocks)
    handle = hvd.allreduce_async(torch.arange(6, dtype=torch.float32), name=f"wait.{blocks}", op=hvd.Sum)
    torch.testing.assert_close(runtime.wait(handle), torch.arange(6, dtype=torch.float32) * hvd.size())


@pytest.mark.parametrize("name", ["wait", "POLL_S"])
def test_the_old_path_in_grouped_warns_and_forwards(name):
    import hvdsync.torch.grouped as grouped

    with pytest.warns(DeprecationWarning, match=f"import {name} from hvdsync.torch.runtime"):
        assert getattr(grouped, name) is getattr(runtime, name)
    with pytest.raises(AttributeError):
        grouped.no_such_name  # noqa: B018
