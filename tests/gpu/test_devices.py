"""On a CUDA machine: what NVML inspection plans with (launcher.inspection.host) is what torch.cuda sees under
the CUDA_VISIBLE_DEVICES this test runs with: the same number of devices, the same free memory within a few %.

Run with `pytest -m gpu tests/gpu/test_devices.py`, also as `CUDA_VISIBLE_DEVICES=1 pytest ...` on a machine
with several GPUs; skipped cleanly where CUDA is not available."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
pynvml = pytest.importorskip("pynvml")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

TOLERANCE = 0.03  # of the device's total: other processes may allocate between two reads
CONTEXT_MAX = 2 * 2**30  # what creating torch's CUDA context may take from the free memory


def test_nvml_sees_the_devices_and_free_memory_torch_sees():
    from launcher.inspection.cuda_devices import VISIBLE_DEVICES_ENV, inspect_gpus

    visible = os.environ.get(VISIBLE_DEVICES_ENV)
    pynvml.nvmlInit()
    try:
        found = inspect_gpus(pynvml, visible)  # before torch makes a CUDA context: what the planner reads
        # one MIG instance per CUDA process: inspection plans for one, torch sees one
        assert found.gpus.count == torch.cuda.device_count(), (visible, found.notes)
        assert found.gpus.memory_bytes == min(d.free_bytes for d in found.devices)
        for ordinal, device in enumerate(found.devices):
            props = torch.cuda.get_device_properties(ordinal)
            assert device.uuid.split("-", 1)[1] == str(props.uuid), (ordinal, device.uuid, props.uuid)
            free, total = torch.cuda.mem_get_info(ordinal)  # cudaMemGetInfo, with torch's context made
            nvml_total, nvml_free_now = _memory(device.handle)
            print(
                f"{visible=} device {ordinal} {device.uuid}: NVML free {device.free_bytes / 2**30:.2f} GiB before "
                f"the context, {nvml_free_now / 2**30:.2f} after; CUDA free {free / 2**30:.2f} of "
                f"{total / 2**30:.2f} GiB"
            )
            assert abs(nvml_free_now - free) <= TOLERANCE * total  # the same quantity, read two ways
            assert abs(nvml_total - total) <= TOLERANCE * total
            assert -TOLERANCE * total <= device.free_bytes - free <= CONTEXT_MAX + TOLERANCE * total
    finally:
        pynvml.nvmlShutdown()


def _memory(handle) -> tuple[int, int]:
    info = pynvml.nvmlDeviceGetMemoryInfo(handle)
    return int(info.total), int(info.free)


def test_the_probe_measures_the_cuda_context_this_process_holds():
    """measure/probe.py: what the process holds outside the caching allocator once cuBLAS ran, the figure the
    plan's "CUDA context" term takes (nominal: 1 GiB); between 100 MiB and 4 GiB on any GPU torch supports."""
    from launcher.measure.probe import measure_cuda_context

    a = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    (a @ a).sum().item()
    context = measure_cuda_context()
    if context is None:
        pytest.skip("NVML cannot tell this process apart (a pid namespace with other processes on the GPU)")
    assert 100 * 2**20 < context < 4 * 2**30
