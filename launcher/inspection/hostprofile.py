"""The host as the planner sees it: one HostProfile, whether this machine was probed live (host.py) or a
described host was read (hostspec.py). The planner never knows which of the two it got.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from launcher.units import GB

# Nominal PCIe bandwidth per direction for an x16 link, from the seeds ("CPU Offload Math":
# PCIe 3.0 x16 ~16 GB/s, 4.0 ~32 GB/s, 5.0 ~64 GB/s); per lane it is x16 / 16.
PCIE_X16_BYTES_PER_S = {3: 16 * GB, 4: 32 * GB, 5: 64 * GB, 6: 128 * GB}
DEFAULT_PCIE_GENERATION = 4


@dataclass(frozen=True)
class GpuSpec:
    """One node's GPUs (identical, as DeepSpeed's launcher assumes)."""

    count: int
    # per GPU, what the plan may use: a live probe's FREE memory (the least on any selected device), a
    # described host's `gpus.memory`
    memory_bytes: int
    name: str = "unknown GPU"
    tflops: float | None = None  # dense bf16/fp16 TFLOP/s per GPU, when known
    compute_capability: tuple[int, int] = (8, 0)
    total_memory_bytes: int | None = None  # per GPU, installed (live probes; None for described hosts)
    # per GPU, per direction, to the node's other GPUs (NVLink, or PCIe peer-to-peer), when described; None: unknown,
    # and the plan takes the GPUs' nominal NVLink or PCIe link (plan/network.py [links])
    interconnect_bytes_per_s: float | None = None

    @property
    def bf16(self) -> bool:
        # bf16 tensor cores arrived with Ampere (compute capability 8.0).
        return self.compute_capability >= (8, 0)


@dataclass(frozen=True)
class NvmeSpec:
    path: str
    free_bytes: int
    is_nvme: bool | None = None  # None when unknown (described hosts)
    aio_usable: bool | None = None  # DeepSpeed's async_io op can be built (libaio present)
    read_bytes_per_s: int | None = None  # sequential, when described
    write_bytes_per_s: int | None = None


@dataclass(frozen=True)
class HostProfile:
    source: str  # "live" or the described host's file
    gpus: GpuSpec
    cpu_memory_bytes: int  # per node
    cpu_memory_available_bytes: int  # per node, now (described hosts: = total)
    cpu_cores: int  # per node
    nodes: int = 1
    pcie_generation: int | None = None
    pcie_width: int | None = None
    pcie_bandwidth_bytes_per_s: int | None = None  # explicit figure wins over generation x width
    link_kind: str | None = None  # a described coherent CPU-GPU link: "nvlink-c2c" (superchips); None: PCIe
    memlock_bytes: int | None = None  # None = unlimited
    shm_bytes: int | None = None
    nvme: NvmeSpec | None = None
    cpu_flags: tuple[str, ...] = ()
    cpu_memory_bandwidth_bytes_per_s: int | None = None  # when described (a probe measures it)
    cpu_adam_params_per_s: float | None = None  # DeepSpeedCPUAdam throughput per node, when described
    # the node's network to the other nodes, per direction, all the NICs its ranks use together, when described;
    # None: unknown (a live host cannot tell), and a plan for several nodes assumes plan/network.py's nominal figure
    network_bytes_per_s: float | None = None
    notes: tuple[str, ...] = field(default=())
    # what the plan should warn about (another process holds memory on a selected GPU, ...)
    warnings: tuple[str, ...] = field(default=())

    @property
    def has_gpu(self) -> bool:
        return self.gpus.count > 0

    @property
    def accelerator(self) -> str:
        return "cuda" if self.has_gpu else "cpu"

    @property
    def ranks_per_node(self) -> int:
        """Processes DeepSpeed starts per node: one per GPU, or one on the CPU accelerator."""
        return max(self.gpus.count, 1)

    @property
    def world_size(self) -> int:
        return self.ranks_per_node * self.nodes

    @property
    def pcie_bytes_per_s(self) -> int:
        """Host<->device bandwidth per direction: explicit figure, else nominal for generation and width."""
        if self.pcie_bandwidth_bytes_per_s:
            return self.pcie_bandwidth_bytes_per_s
        generation = self.pcie_generation or DEFAULT_PCIE_GENERATION
        x16 = PCIE_X16_BYTES_PER_S.get(generation, PCIE_X16_BYTES_PER_S[DEFAULT_PCIE_GENERATION])
        return x16 * (self.pcie_width or 16) // 16

    def to_json(self) -> dict:
        return {
            "source": self.source,
            "accelerator": self.accelerator,
            "nodes": self.nodes,
            "gpus": {
                "count": self.gpus.count,
                "memory_bytes": self.gpus.memory_bytes,
                "total_memory_bytes": self.gpus.total_memory_bytes,
                "name": self.gpus.name,
                "tflops": self.gpus.tflops,
                "compute_capability": ".".join(map(str, self.gpus.compute_capability)),
                "bf16": self.gpus.bf16,
                "interconnect_bytes_per_s": self.gpus.interconnect_bytes_per_s,
            },
            "cpu_memory_bytes": self.cpu_memory_bytes,
            "cpu_memory_available_bytes": self.cpu_memory_available_bytes,
            "cpu_cores": self.cpu_cores,
            "cpu_simd": [f for f in ("avx512f", "avx2") if f in self.cpu_flags],
            "pcie": {
                "generation": self.pcie_generation,
                "width": self.pcie_width,
                "bandwidth_bytes_per_s": self.pcie_bytes_per_s,
            },
            "memlock_bytes": self.memlock_bytes,
            "shm_bytes": self.shm_bytes,
            "nvme": None
            if self.nvme is None
            else {
                "path": self.nvme.path,
                "free_bytes": self.nvme.free_bytes,
                "is_nvme": self.nvme.is_nvme,
                "aio_usable": self.nvme.aio_usable,
                "read_bytes_per_s": self.nvme.read_bytes_per_s,
                "write_bytes_per_s": self.nvme.write_bytes_per_s,
            },
            "cpu_memory_bandwidth_bytes_per_s": self.cpu_memory_bandwidth_bytes_per_s,
            "cpu_adam_params_per_s": self.cpu_adam_params_per_s,
            "network_bytes_per_s": self.network_bytes_per_s,
            "notes": list(self.notes),
            "warnings": list(self.warnings),
        }
