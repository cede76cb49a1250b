"""One rank's GPU memory over a step, as the plan predicts it per device: the caching allocator's peak plus what
the process holds outside it, read through NVML where it can tell this process apart; and the figures' largest
over ranks (trainer.py gathers them every step)."""

from __future__ import annotations

import os

from launcher.inspection.cuda_devices import nvml_handle, nvml_process_bytes
from launcher.rank.progress import GPU_SOURCES, gpu_step_figures


def max_over_ranks(dist, values: list[float], device) -> list[float]:
    """Each value's largest over all ranks: one all-reduce MAX of a float64 tensor (exact for byte counts
    below 2**53) on the engine's device, since NCCL reduces no CPU tensors. Collective."""
    import torch

    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor.tolist()


class GpuMemory:
    """This rank's GPU memory over one step: the caching allocator's peak (its statistics are reset when the
    step starts) plus what the process holds outside the allocator (CUDA context, NCCL buffers, cuBLAS),
    which is what the plan predicts per device.

    What the process holds comes from NVML's per-process figure for this device when NVML can tell which
    process is this one: its own pid, or the only process on the device (a container's pid namespace hides
    the host pids NVML reports, but the only process holding memory on our device is this one). Otherwise
    it is the device's total - free (cudaMemGetInfo), which also counts other processes on the same GPU; the
    source says which (GPU_SOURCES), and run.json reports the worst over ranks and steps."""

    def __init__(self, torch, device, nvml=None):
        self.torch, self.device = torch, torch.device(device)
        self.pid = os.getpid()
        self.nvml, self.handle = nvml_handle(torch, self.device) if nvml is None else nvml

    def start_step(self) -> None:
        self.torch.cuda.reset_peak_memory_stats(self.device)

    def end_step(self) -> tuple[dict, str]:
        """(gpu_step_figures of the step that just ended, the source of the process's bytes)."""
        cuda = self.torch.cuda
        cuda.synchronize(self.device)
        reserved_now = cuda.memory_reserved(self.device)
        used, source = self.process_used()
        figures = gpu_step_figures(
            cuda.max_memory_reserved(self.device), cuda.max_memory_allocated(self.device), used, reserved_now
        )
        return figures, source

    def process_used(self) -> tuple[int, str]:
        """(bytes this process holds on its device, GPU_SOURCES entry)."""
        used = nvml_process_bytes(self.nvml, self.handle, self.pid)
        if used is not None:
            return used, GPU_SOURCES[0]
        free, total = self.torch.cuda.mem_get_info(self.device)
        return total - free, GPU_SOURCES[1]
