"""Which GPUs a run may use, and how much of their memory: CUDA_VISIBLE_DEVICES (indices, GPU-/MIG- UUIDs, the
empty string), free against total memory, MIG instances, other processes on a GPU.

There is no GPU on the machines these tests run on, so NVML is a stand-in: FakeNvml below has the names,
signatures and return types of nvidia-ml-py's pynvml (its own error classes, constants and memory structures),
and nothing else. tests/gpu/test_devices.py checks the real NVML against torch.cuda on a GPU machine."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from types import SimpleNamespace

import pynvml
import pytest

from launcher.errors import UserInputError
from launcher.inspection.cuda_devices import (
    inspect_gpus,
    inspect_visible_gpus,
    launch_devices,
    parse_visible_devices,
    rank_devices,
)
from launcher.inspection.host import inspect_host

GiB = 2**30


@dataclass
class FakeDevice:
    uuid: str
    name: str
    total: int
    free: int
    processes: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, usedGpuMemory)
    mig: list[FakeDevice] | None = None  # MIG instances, by slot (None: an empty slot); None: MIG off
    mig_capable: bool = False
    error: int | None = None  # an NVML error code every query of this GPU raises (lost, no permission)


class FakeNvml:
    """pynvml's device queries over a list of FakeDevice, in NVML index order."""

    NVMLError = pynvml.NVMLError
    NVML_DEVICE_MIG_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE
    NVML_DEVICE_MIG_DISABLE = pynvml.NVML_DEVICE_MIG_DISABLE
    nvmlMemory_v2 = pynvml.nvmlMemory_v2

    NVML_ERROR_LIBRARY_NOT_FOUND = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
    NVML_ERROR_DRIVER_NOT_LOADED = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    NVML_ERROR_UNINITIALIZED = pynvml.NVML_ERROR_UNINITIALIZED

    def __init__(self, gpus: list[FakeDevice], v2: bool = True, init_error: int | None = None):
        self.gpus, self.v2, self.init_error = gpus, v2, init_error

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        return None

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeDevice:
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self.gpus[index]

    def nvmlDeviceGetName(self, handle: FakeDevice) -> str:
        if handle.error is not None:
            raise pynvml.NVMLError(handle.error)
        return handle.name  # pynvml decodes it (convertStrBytes)

    def nvmlDeviceGetUUID(self, handle: FakeDevice) -> str:
        return handle.uuid

    def nvmlDeviceGetMemoryInfo(self, handle: FakeDevice, version=None):
        if not version:
            return pynvml.c_nvmlMemory_t(total=handle.total, free=handle.free, used=handle.total - handle.free)
        if not self.v2:  # a driver without nvmlDeviceGetMemoryInfo_v2
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        reserved = 300 * 2**20
        return pynvml.c_nvmlMemory_v2_t(
            version=version,
            total=handle.total,
            reserved=reserved,
            free=handle.free,
            used=handle.total - handle.free - reserved,
        )

    def nvmlDeviceGetCudaComputeCapability(self, handle: FakeDevice) -> tuple[int, int]:
        return (8, 0)

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: FakeDevice) -> int:
        return 4

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: FakeDevice) -> int:
        return 16

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeDevice) -> list:
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in handle.processes]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: FakeDevice) -> list:
        return []

    def nvmlDeviceGetMigMode(self, device: FakeDevice) -> list[int]:
        if not device.mig_capable:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [pynvml.NVML_DEVICE_MIG_ENABLE if device.mig is not None else pynvml.NVML_DEVICE_MIG_DISABLE] * 2

    def nvmlDeviceGetMaxMigDeviceCount(self, device: FakeDevice) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: FakeDevice, index: int) -> FakeDevice:
        instances = device.mig or []
        if index >= len(instances) or instances[index] is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return instances[index]


def four_gpus() -> list[FakeDevice]:
    return [
        FakeDevice(f"GPU-{c}{c}{c}-0000", "NVIDIA A100-SXM4-40GB", 40 * GiB, free)
        for c, free in zip("abcd", (39 * GiB, 12 * GiB, 39 * GiB, 30 * GiB), strict=True)
    ]


def mig_host() -> list[FakeDevice]:
    """GPU 0 whole; GPU 1 in MIG mode with instances in slots 0 and 2."""
    instances = [
        FakeDevice("MIG-0f0f-1111", "NVIDIA A100-SXM4-40GB MIG 3g.20gb", 20 * GiB, 19 * GiB),
        None,
        FakeDevice("MIG-0e0e-2222", "NVIDIA A100-SXM4-40GB MIG 1g.5gb", 5 * GiB, 4 * GiB),
    ]
    return [
        FakeDevice("GPU-aaa-0000", "NVIDIA A100-SXM4-40GB", 40 * GiB, 39 * GiB, mig_capable=True),
        FakeDevice("GPU-bbb-0000", "NVIDIA A100-SXM4-40GB", 40 * GiB, 40 * GiB, mig=instances, mig_capable=True),
    ]


@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        (None, None),
        ("", []),
        ("1,3", ["1", "3"]),
        (" 2 , 0", ["2", "0"]),
        ("1gpu2,3", ["1", "3"]),  # read like strtoul
        ("0,-1,2", ["0"]),  # a negative entry ends the list
        ("0,x,2", ["0"]),  # so does an unreadable one
        ("1,1", []),  # a repeated entry leaves nothing
        ("GPU-abc,GPU-def,3", ["GPU-abc", "GPU-def"]),
        ("MIG-0f0f", ["MIG-0f0f"]),
    ],
)
def test_cuda_visible_devices_are_read_as_cuda_reads_them(value, parsed):
    assert parse_visible_devices(value) == parsed


def test_only_the_visible_gpus_count_with_their_free_memory():
    found = inspect_gpus(FakeNvml(four_gpus()), "1,3")
    assert found.gpus.count == 2
    assert [d.index for d in found.devices] == [1, 3]
    assert found.gpus.memory_bytes == 12 * GiB  # free on GPU 1, the least of the two: what the plan may use
    assert found.gpus.total_memory_bytes == 40 * GiB
    assert any("12.0 GiB free of 40.0 GiB" in n for n in found.notes), found.notes


def test_every_gpu_counts_when_cuda_visible_devices_is_unset():
    found = inspect_gpus(FakeNvml(four_gpus(), v2=False), None)  # the v1 memory query on an older driver
    assert found.gpus.count == 4 and found.gpus.memory_bytes == 12 * GiB
    assert found.gpus.name == "NVIDIA A100-SXM4-40GB" and found.pcie_generation == 4


def test_gpus_named_by_uuid_or_unique_prefix():
    found = inspect_gpus(FakeNvml(four_gpus()), "GPU-ddd-0000,GPU-a")
    assert [d.index for d in found.devices] == [3, 0]
    assert found.gpus.memory_bytes == 30 * GiB
    # an unknown UUID ends the list, as in CUDA
    assert [d.index for d in inspect_gpus(FakeNvml(four_gpus()), "GPU-ccc,GPU-zzz,GPU-a").devices] == [2]


def test_empty_cuda_visible_devices_means_no_gpu():
    found = inspect_gpus(FakeNvml(four_gpus()), "")
    assert found.gpus.count == 0 and found.devices == ()
    assert any("no GPU visible" in n for n in found.notes)


def test_an_index_past_the_last_gpu_selects_nothing():
    assert inspect_gpus(FakeNvml(four_gpus()), "7").gpus.count == 0


def test_a_mig_gpu_is_its_instances_each_with_its_own_memory():
    nvml = FakeNvml(mig_host())
    found = inspect_gpus(nvml, "MIG-0e0e-2222")
    assert found.gpus.count == 1
    assert found.gpus.memory_bytes == 4 * GiB and found.gpus.total_memory_bytes == 5 * GiB
    assert found.gpus.name.endswith("MIG 1g.5gb")
    assert found.devices[0].index == 1  # its GPU's index: what DeepSpeed's --include can name
    # the GPU in MIG mode is never one 40 GiB device; one process uses one instance
    whole = inspect_gpus(nvml, "1")
    assert whole.gpus.count == 1 and whole.gpus.memory_bytes == 19 * GiB
    assert any("MIG" in n for n in whole.notes)


def test_another_process_on_a_selected_gpu_is_a_warning():
    gpus = four_gpus()
    gpus[1].processes = [(4242, 28 * GiB)]
    gpus[2].processes = [(4343, 1 * GiB)]  # not selected
    found = inspect_gpus(FakeNvml(gpus), "1,3")
    assert len(found.warnings) == 1
    assert "GPU 1" in found.warnings[0] and "4242" in found.warnings[0]


def test_live_inspection_reads_cuda_visible_devices(monkeypatch):
    gpus = four_gpus()
    gpus[3].processes = [(777, 10 * GiB)]
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(gpus))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,3")
    host = inspect_host()
    assert host.gpus.count == 2 and host.gpus.memory_bytes == 30 * GiB
    assert host.gpus.total_memory_bytes == 40 * GiB
    assert any("777" in w for w in host.warnings)
    assert host.to_json()["gpus"]["total_memory_bytes"] == 40 * GiB and host.to_json()["warnings"]


def test_launch_devices_follow_cuda_visible_devices():
    nvml = FakeNvml(four_gpus())
    assert launch_devices(None, 2, nvml) is None  # unset: DeepSpeed's own 0..N-1
    assert launch_devices("1,3", 2, nvml) == ((1, 3), False)
    assert launch_devices("3,1,0", 2, nvml) == ((3, 1), False)  # the first N, in the user's order
    assert launch_devices("GPU-ddd,GPU-bbb", 2, nvml) == ((3, 1), True)  # NVML indices: PCI bus order
    assert launch_devices("MIG-0e0e", 1, FakeNvml(mig_host())) == ((1,), True)
    assert rank_devices("MIG-0e0e,MIG-0f0f") == "MIG-0e0e"  # the rank gets the instance itself (job/launch.py)
    assert rank_devices("1") is None and rank_devices("GPU-bbb") is None and rank_devices(None) is None
    with pytest.raises(UserInputError, match="leaves no GPU visible"):
        launch_devices("", 1, nvml)
    with pytest.raises(UserInputError, match="selects 2 GPU"):
        launch_devices("1,3", 4, nvml)


def test_a_gpu_nvml_cannot_read_is_left_out_with_one_line():
    gpus = four_gpus()
    gpus[1] = replace(gpus[1], error=pynvml.NVML_ERROR_GPU_IS_LOST)
    found = inspect_gpus(FakeNvml(gpus), None)
    assert found.gpus.count == 3 and [d.index for d in found.devices] == [0, 2, 3]
    assert found.warnings[0] == "GPU 1: NVML cannot read it (GPU is lost); left out of the plan (nvidia-smi -i 1)"
    assert inspect_gpus(FakeNvml(gpus), "1").gpus.count == 0  # the selected GPU is the lost one: no GPU to plan for


def test_a_driver_nvml_cannot_use_is_one_line_and_no_driver_is_the_cpu(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    mismatch = FakeNvml(four_gpus(), init_error=pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH)
    with pytest.raises(
        UserInputError, match=r"^NVML cannot start \(RM has detected an NVML/RM version mismatch.\): .* reboot"
    ):
        inspect_visible_gpus(mismatch)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the user asked for the CPU: NVML is not started
    assert inspect_visible_gpus(mismatch).gpus.count == 0
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    for absent in (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, pynvml.NVML_ERROR_DRIVER_NOT_LOADED):
        assert inspect_visible_gpus(FakeNvml(four_gpus(), init_error=absent)).gpus.count == 0
    assert inspect_visible_gpus(FakeNvml(four_gpus())).gpus.count == 4
