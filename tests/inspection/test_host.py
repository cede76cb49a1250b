"""Live host inspection: the probe on this machine and the NVMe folder checks."""

from __future__ import annotations

import resource

import pytest

from launcher.errors import UserInputError
from launcher.inspection.host import inspect_host, inspect_nvme


def test_live_probe_of_this_machine():
    import psutil

    host = inspect_host()
    assert host.source == "live"
    assert host.cpu_memory_bytes == psutil.virtual_memory().total
    assert 0 < host.cpu_memory_available_bytes <= host.cpu_memory_bytes
    assert host.cpu_cores >= 1
    soft = resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]
    assert host.memlock_bytes == (None if soft == resource.RLIM_INFINITY else soft)
    assert host.shm_bytes is None or host.shm_bytes > 0
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if not has_cuda:
        assert host.gpus.count == 0 and any("CPU accelerator" in n for n in host.notes)


def test_nvme_probe(tmp_path):
    nvme = inspect_nvme(str(tmp_path))
    assert nvme.free_bytes > 0 and nvme.path == str(tmp_path)
    assert isinstance(nvme.aio_usable, bool)


@pytest.mark.parametrize("kind", ["missing", "file"])
def test_nvme_path_errors(tmp_path, kind):
    target = tmp_path / "x"
    if kind == "file":
        target.write_text("")
    with pytest.raises(UserInputError, match="does not exist" if kind == "missing" else "not a directory"):
        inspect_nvme(str(target))
