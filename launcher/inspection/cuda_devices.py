"""This machine's CUDA devices through NVML, as CUDA_VISIBLE_DEVICES selects them (indices, GPU-/MIG- UUIDs, the
empty string for none): their free and total memory, MIG instances as devices, memory other processes hold;
and the device indices DeepSpeed's runner must be given (--include) to honour the selection. host.py folds the
result into the HostProfile."""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass

from launcher.errors import UserInputError
from launcher.inspection.hostprofile import GpuSpec

VISIBLE_DEVICES_ENV = "CUDA_VISIBLE_DEVICES"
# DeepSpeed's launch.py gives each rank CUDA_VISIBLE_DEVICES as integer ids (CUDAAccelerator.set_visible_devices_envs),
# which on a GPU in MIG mode is its first instance, whichever one the user named: a MIG instance selected by UUID
# travels to the rank in this variable, which sets CUDA_VISIBLE_DEVICES from it before CUDA starts (launcher/rank).
RANK_DEVICES_ENV = "OFFLOAD_LAUNCH_CUDA_VISIBLE_DEVICES"
# Memory other processes hold on a selected GPU beyond this is worth a warning when NVML cannot list them.
HELD_MEMORY_WARNING_BYTES = 512 * 2**20


def parse_visible_devices(value: str | None) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES as CUDA reads it (mirrors torch.cuda._parse_visible_devices): None when unset (every
    device is visible); [] for the empty string (none is). Indices are read like strtoul ("1gpu2" is 1) and a
    negative or unreadable entry ends the list; a list that starts with GPU- or MIG- holds UUIDs (or unique UUID
    prefixes) and ends at the first entry without that prefix; a repeated entry makes the whole list empty."""
    if value is None:
        return None
    for prefix in ("GPU-", "MIG-"):
        if value.startswith(prefix):
            uuids: list[str] = []
            for element in value.split(","):
                element = element.strip()
                if element in uuids:
                    return []
                if not element.startswith(prefix):
                    break
                uuids.append(element)
            return uuids
    indices: list[str] = []
    for element in value.split(","):
        digits = re.match(r"\+?\d+", element.strip())
        if digits is None:
            break
        index = str(int(digits[0]))
        if index in indices:
            return []
        indices.append(index)
    return indices


@dataclass(frozen=True)
class CudaDevice:
    """One device a CUDA process can be given: a whole GPU, or a MIG instance of a GPU in MIG mode."""

    index: int  # the physical GPU's NVML index (PCI bus order): what DeepSpeed's --include localhost:IDS names
    uuid: str  # GPU-... for a whole GPU, MIG-... for a MIG instance
    name: str
    total_bytes: int
    free_bytes: int
    handle: object  # NVML handle of the device (the MIG device handle for an instance)
    parent: object  # NVML handle of the physical GPU (itself for a whole GPU)
    parent_uuid: str  # the physical GPU's GPU-... UUID
    mig: bool = False


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _memory(nvml, handle) -> tuple[int, int]:
    """(total, free) bytes. The v2 query (driver >= 510) counts the driver's reserved memory apart from `used`;
    `free` means the same in both: what a new allocation can still get."""
    try:
        info = nvml.nvmlDeviceGetMemoryInfo(handle, version=nvml.nvmlMemory_v2)
    except (nvml.NVMLError, AttributeError, TypeError):
        info = nvml.nvmlDeviceGetMemoryInfo(handle)
    return int(info.total), int(info.free)


def _mig_enabled(nvml, handle) -> bool:
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
    except nvml.NVMLError:  # NotSupported: a GPU without MIG
        return False
    return current == nvml.NVML_DEVICE_MIG_ENABLE


def nvml_devices(nvml, problems: list[str] | None = None) -> list[CudaDevice]:
    """Every device NVML shows, in NVML order: a whole GPU as itself, a GPU in MIG mode as its MIG instances
    (each with its own memory), never as the whole GPU, which no CUDA process can use as one device. A GPU NVML
    cannot read (lost, no permission, in reset) is left out, with one line in `problems` that names it."""
    devices = []
    for index in range(nvml.nvmlDeviceGetCount()):
        try:
            devices.extend(_gpu_devices(nvml, index))
        except nvml.NVMLError as exc:
            if problems is not None:
                problems.append(
                    f"GPU {index}: NVML cannot read it ({exc}); left out of the plan (nvidia-smi -i {index})"
                )
    return devices


def _gpu_devices(nvml, index: int) -> list[CudaDevice]:
    """GPU `index` as the devices a CUDA process can be given: itself, or its MIG instances."""
    gpu = nvml.nvmlDeviceGetHandleByIndex(index)
    if not _mig_enabled(nvml, gpu):
        total, free = _memory(nvml, gpu)
        name, uuid = _text(nvml.nvmlDeviceGetName(gpu)), _text(nvml.nvmlDeviceGetUUID(gpu))
        return [CudaDevice(index, uuid, name, total, free, gpu, gpu, uuid)]
    devices = []
    for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(gpu)):
        try:
            instance = nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, slot)
        except nvml.NVMLError:  # NotFound: no instance in this slot
            continue
        total, free = _memory(nvml, instance)
        parent_uuid = _text(nvml.nvmlDeviceGetUUID(gpu))
        name, uuid = _text(nvml.nvmlDeviceGetName(instance)), _text(nvml.nvmlDeviceGetUUID(instance))
        devices.append(CudaDevice(index, uuid, name, total, free, instance, gpu, parent_uuid, mig=True))
    return devices


def select_devices(devices: list[CudaDevice], visible: list[str] | None) -> list[CudaDevice]:
    """The devices CUDA_VISIBLE_DEVICES (parsed) selects, in its order. Indices count whole GPUs by NVML index
    (CUDA's own order is the same on a node of identical GPUs, or with CUDA_DEVICE_ORDER=PCI_BUS_ID); a GPU in
    MIG mode named by index stands for its MIG instances. UUIDs match a whole GPU or a MIG instance, by unique
    prefix as CUDA allows; an unknown or ambiguous entry ends the list, as CUDA's does."""
    if visible is None:
        return list(devices)
    chosen: list[CudaDevice] = []
    for entry in visible:
        if entry.isdigit():
            matches = [d for d in devices if d.index == int(entry)]
        elif entry.startswith("GPU-"):  # a whole GPU, or every MIG instance of a GPU in MIG mode
            gpus = {d.parent_uuid for d in devices if d.parent_uuid.startswith(entry)}
            matches = [d for d in devices if d.parent_uuid in gpus] if len(gpus) == 1 else []
        else:
            matches = [d for d in devices if d.uuid.startswith(entry)]
            matches = matches if len(matches) == 1 else []
        if not matches:
            break
        chosen.extend(d for d in matches if d not in chosen)
    return chosen


@dataclass(frozen=True)
class GpuInspection:
    """What NVML says about the GPUs this process may use (`devices`, in CUDA_VISIBLE_DEVICES order)."""

    gpus: GpuSpec
    pcie_generation: int | None = None
    pcie_width: int | None = None
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    devices: tuple[CudaDevice, ...] = ()


NO_GPU = GpuSpec(count=0, memory_bytes=0, name="none")


def _held_by_others(nvml, device: CudaDevice) -> str | None:
    """In words, what other processes hold on `device`; None when nothing is seen. NVML lists the processes
    (other containers' too, by host pid); where it cannot, memory in use beyond the driver's share tells."""
    from launcher.units import fmt_bytes

    held: dict[int, int | None] = {}
    listed = False
    for query in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        try:
            processes = getattr(nvml, query)(device.handle)
        except (nvml.NVMLError, AttributeError):
            continue
        listed = True
        for process in processes:
            if process.pid != os.getpid():
                held[process.pid] = process.usedGpuMemory  # None where the driver does not say
    used = device.total_bytes - device.free_bytes
    if held:
        pids = ", ".join(map(str, sorted(held)))
        return f"{len(held)} other process(es) (pid {pids}) hold {fmt_bytes(used)}"
    if not listed and used > HELD_MEMORY_WARNING_BYTES:
        return f"{fmt_bytes(used)} is in use"
    return None


def inspect_gpus(nvml, visible: str | None) -> GpuInspection:
    """The GpuSpec to plan with, from an initialised NVML (pynvml, or anything with its functions) and the
    CUDA_VISIBLE_DEVICES value: only the selected devices count, and each offers the memory FREE now (the
    least of them), total kept beside it; MIG instances are devices of their own."""
    from launcher.units import fmt_bytes

    notes: list[str] = []
    selection = parse_visible_devices(visible)
    if selection == []:
        notes.append(f"{VISIBLE_DEVICES_ENV}={visible!r} leaves no GPU visible")
        return GpuInspection(NO_GPU, notes=tuple(notes))
    unreadable: list[str] = []
    everything = nvml_devices(nvml, unreadable)
    devices = select_devices(everything, selection)
    if not devices:
        if selection is not None and everything:
            notes.append(f"{VISIBLE_DEVICES_ENV}={visible} names no GPU this machine has")
        return GpuInspection(NO_GPU, notes=tuple(notes), warnings=tuple(unreadable))
    devices = _one_mig_instance(devices, notes)
    notes += _selection_notes(visible, selection, devices, everything)
    free = min(d.free_bytes for d in devices)
    total = min(d.total_bytes for d in devices)
    if free < total:
        notes.append(f"GPU memory: planning with the {fmt_bytes(free)} free of {fmt_bytes(total)} per device")
    warnings = unreadable + _in_use_warnings(nvml, devices)
    capability, generation, width = _capability_and_link(nvml, devices)
    smallest = min(devices, key=lambda d: d.free_bytes)
    spec = GpuSpec(
        count=len(devices),
        memory_bytes=free,
        name=smallest.name,
        compute_capability=capability,
        total_memory_bytes=total,
    )
    return GpuInspection(spec, generation, width, tuple(notes), tuple(warnings), tuple(devices))


def _one_mig_instance(devices: list[CudaDevice], notes: list[str]) -> list[CudaDevice]:
    """The devices to plan for: with MIG instances among them, the first alone (its note added to `notes`)."""
    if any(d.mig for d in devices):
        # CUDA gives one process one MIG instance (the first it is shown), and NCCL cannot join instances.
        if len(devices) > 1:
            notes.append(
                f"MIG: a CUDA process uses one MIG instance, and instances cannot train together; planning for "
                f"one rank on {devices[0].uuid} ({devices[0].name})"
            )
        devices = devices[:1]
    return devices


def _selection_notes(
    visible: str | None, selection: list[str] | None, devices: list[CudaDevice], everything: list[CudaDevice]
) -> list[str]:
    """What the selection plans for: the devices CUDA_VISIBLE_DEVICES names, GPUs that differ, and indices CUDA
    may number differently from NVML."""
    notes = []
    if selection is not None:
        shown = ", ".join(d.uuid if d.mig else str(d.index) for d in devices)
        notes.append(f"{VISIBLE_DEVICES_ENV}={visible}: planning for {len(devices)} device(s): {shown}")
    names = {d.name for d in devices}
    if len(names) > 1:
        notes.append(f"GPUs differ ({', '.join(sorted(names))}); planning for the smallest")
    by_index = bool(selection) and selection[0].isdigit()
    if by_index and len({d.name for d in everything}) > 1 and os.environ.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID":
        notes.append(
            "this machine's GPUs differ: CUDA numbers them fastest first, NVML and nvidia-smi by PCI bus; "
            "set CUDA_DEVICE_ORDER=PCI_BUS_ID so that CUDA_VISIBLE_DEVICES indices name the GPUs planned for"
        )
    return notes


def _in_use_warnings(nvml, devices: list[CudaDevice]) -> list[str]:
    """One warning per device other processes hold memory on."""
    from launcher.units import fmt_bytes

    warnings = []
    for device in devices:
        held = _held_by_others(nvml, device)
        if held:
            what = device.uuid if device.mig else f"GPU {device.index}"
            warnings.append(
                f"{what} ({device.name}) is in use: {held}; the plan uses the {fmt_bytes(device.free_bytes)} "
                f"free of {fmt_bytes(device.total_bytes)}, and that can shrink while the job runs"
            )
    return warnings


def _capability_and_link(nvml, devices: list[CudaDevice]) -> tuple[tuple[int, int], int | None, int | None]:
    """The least compute capability and PCIe link (generation, width; None where NVML cannot tell) of the
    physical GPUs behind `devices`."""
    parents = list({id(d.parent): d.parent for d in devices}.values())
    capability = min(tuple(nvml.nvmlDeviceGetCudaComputeCapability(h)) for h in parents)
    try:
        generation = min(nvml.nvmlDeviceGetMaxPcieLinkGeneration(h) for h in parents)
        width = min(nvml.nvmlDeviceGetMaxPcieLinkWidth(h) for h in parents)
    except nvml.NVMLError:
        generation = width = None
    return capability, generation, width


def _no_driver(nvml, exc: Exception) -> bool:
    """nvmlInit failed because this machine has no NVIDIA driver (its library absent or not loaded): the CPU
    accelerator is the plan. Any other failure (a driver/library version mismatch after an upgrade without a reboot,
    no permission on /dev/nvidia*) means GPUs a run could not use."""
    absent = (nvml.NVML_ERROR_LIBRARY_NOT_FOUND, nvml.NVML_ERROR_DRIVER_NOT_LOADED, nvml.NVML_ERROR_UNINITIALIZED)
    return not isinstance(exc, nvml.NVMLError) or exc.value in absent


@contextlib.contextmanager
def _nvml(nvml=None):
    """pynvml (or `nvml`, for tests), initialised, or None where there is no NVIDIA driver; a driver NVML cannot
    use is one line, not a silent plan for the CPU."""
    try:
        if nvml is None:
            import pynvml as nvml
        nvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - no NVIDIA driver: plan for DeepSpeed's CPU accelerator
        if nvml is not None and not _no_driver(nvml, exc):
            raise UserInputError(
                f"NVML cannot start ({exc}): the NVIDIA driver is installed but unusable (after a driver upgrade, "
                f"reboot or reload the nvidia module; check nvidia-smi); CUDA_VISIBLE_DEVICES='' plans for the CPU"
            ) from exc
        yield None
        return
    try:
        yield nvml
    finally:
        nvml.nvmlShutdown()


def inspect_visible_gpus(nvml=None) -> GpuInspection:
    """GPUs through NVML, as CUDA_VISIBLE_DEVICES selects them. No driver / no GPU is a valid answer: count 0; so
    is an empty CUDA_VISIBLE_DEVICES, which does not start NVML at all. `nvml`: an uninitialised NVML (tests)."""
    visible = os.environ.get(VISIBLE_DEVICES_ENV)
    if parse_visible_devices(visible) == []:
        return inspect_gpus(None, visible)
    with _nvml(nvml) as started:
        if started is None:
            return GpuInspection(NO_GPU)
        return inspect_gpus(started, visible)


def launch_devices(visible: str | None, ranks: int, nvml=None) -> tuple[tuple[int, ...], bool] | None:
    """The GPUs (indices) DeepSpeed's runner must put `ranks` ranks on to honour CUDA_VISIBLE_DEVICES, as
    (indices, by_pci_bus): None when it is unset (DeepSpeed's default: GPUs 0..ranks-1). Indices pass through
    as CUDA reads them; UUIDs become NVML indices (PCI bus order), so `by_pci_bus` asks the ranks for
    CUDA_DEVICE_ORDER=PCI_BUS_ID. A MIG instance can only be named by its GPU's index: DeepSpeed's launcher
    writes integer ids into each rank's CUDA_VISIBLE_DEVICES. `nvml`: an initialised NVML (for tests)."""
    selection = parse_visible_devices(visible)
    if selection is None:
        return None
    if not selection:
        raise UserInputError(
            f"{VISIBLE_DEVICES_ENV}={visible!r} leaves no GPU visible, but the plan is for {ranks} GPU rank(s); "
            f"unset it, or name the GPUs to use"
        )
    by_pci_bus = not all(entry.isdigit() for entry in selection)
    if not by_pci_bus:
        indices = [int(entry) for entry in selection]
    elif nvml is not None:
        indices = _uuid_indices(nvml, selection)
    else:
        with _nvml() as found:
            if found is None:
                raise UserInputError(f"{VISIBLE_DEVICES_ENV}={visible} names GPUs by UUID, but NVML is unavailable")
            indices = _uuid_indices(found, selection)
    if len(indices) < ranks:
        raise UserInputError(
            f"{VISIBLE_DEVICES_ENV}={visible} selects {len(indices)} GPU(s), but the plan is for {ranks} rank(s) "
            f"per node; pass --num-gpus {len(indices)} or name more GPUs"
        )
    return tuple(indices[:ranks]), by_pci_bus


def rank_devices(visible: str | None) -> str | None:
    """What the rank's CUDA_VISIBLE_DEVICES must be when DeepSpeed's integer ids cannot say it: the MIG instance
    CUDA_VISIBLE_DEVICES names first (one instance per process), None otherwise."""
    selection = parse_visible_devices(visible)
    return selection[0] if selection and selection[0].startswith("MIG-") else None


def _uuid_indices(nvml, selection: list[str]) -> list[int]:
    devices = select_devices(nvml_devices(nvml), selection)
    if any(d.mig for d in devices):
        devices = devices[:1]  # one MIG instance per process (see inspect_gpus)
    return list(dict.fromkeys(d.index for d in devices))


def nvml_handle(torch, device) -> tuple[object, object]:
    """(pynvml, the NVML handle of `device`) matched by UUID (CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER
    renumber devices, NVML does not); (None, None) without NVML or a match (a MIG slice, for one)."""
    # no NVML, no driver or no UUID (any NVMLError, ImportError, ...): the caller falls back to total - free
    with contextlib.suppress(Exception):
        import pynvml

        pynvml.nvmlInit()
        uuid = str(torch.cuda.get_device_properties(device).uuid)
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetUUID(handle)
            if (name.decode() if isinstance(name, bytes) else str(name)).endswith(uuid):
                return pynvml, handle
    return None, None


def nvml_process_bytes(nvml, handle, pid: int) -> int | None:
    """What NVML says process `pid` holds on the device (context included); also the only process listed,
    which must be this one when this one holds memory there. None when NVML cannot tell."""
    if nvml is None or handle is None:
        return None
    try:
        processes = list(nvml.nvmlDeviceGetComputeRunningProcesses(handle))
    except Exception:  # noqa: BLE001 - NVML errors are a reason to fall back, not to stop training
        return None
    mine = [p for p in processes if p.pid == pid] or (processes if len(processes) == 1 else [])
    used = [p.usedGpuMemory for p in mine]
    if not used or any(not isinstance(u, int) or u <= 0 or u >= 2**63 for u in used):
        return None  # NVML_VALUE_NOT_AVAILABLE (all bits set) where the driver hides per-process figures
    return sum(used)
