"""Described hosts (`--host-spec`): a YAML or JSON description read into the same HostProfile a live probe
gives (host.py). Nothing on this machine is read or checked. Every error names the file, the key and (YAML)
its line: `host.yaml:3: gpus.memory: ...`; docs/recipes-and-hosts.md, "Described hosts", lists the keys.
"""

from __future__ import annotations

import contextlib
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path

from launcher import textfiles
from launcher.errors import UserInputError, unknown_key_message
from launcher.inspection.hostprofile import PCIE_X16_BYTES_PER_S, GpuSpec, HostProfile, NvmeSpec
from launcher.units import parse_size

DEFAULT_CPU_CORES = 16

_TOP_KEYS = {
    "name",
    "gpus",
    "nodes",
    "cpu_memory",
    "cpu_cores",
    "pcie",
    "link",
    "nvme",
    "memlock",
    "shm",
    "cpu_memory_bandwidth",
    "cpu_adam_params_per_s",
    "network",
}
_GPU_KEYS = {"count", "memory", "name", "tflops", "compute_capability", "interconnect"}
_PCIE_KEYS = {"generation", "width", "bandwidth"}
_LINK_KEYS = {"kind", "bandwidth"}
# a CPU-GPU link that is not PCIe: NVLink-C2C on GH200/GB200-class superchips (450 GB/s per direction on GH200)
LINK_KINDS = ("pcie", "nvlink-c2c")
_NVME_KEYS = {"path", "free", "is_nvme", "read", "write"}
_NETWORK_KEYS = {"bandwidth", "nics"}


def _check_keys(section: dict, allowed: set[str], where: str, path: str, lines: dict[str, int], prefix: str) -> None:
    for key in section:
        if key not in allowed:
            line = lines.get(prefix + str(key))
            at = f"{path}:{line}" if line else path
            raise UserInputError(unknown_key_message(str(key), allowed, f"{where} ({at})"))


def _number(value: object, what: str, *, integer: bool = True, minimum: float = 0) -> int | float:
    if isinstance(value, str) and not integer:
        with contextlib.suppress(ValueError):  # YAML 1.1 reads 2e9 as a string
            value = float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
        kind = "an integer" if integer else "a number"
        raise UserInputError(f"{what}: expected {kind}, got {value!r}")
    if not math.isfinite(value):
        raise UserInputError(f"{what}: must be a finite number, got {value}")
    if value < minimum:
        raise UserInputError(f"{what}: must be at least {minimum}, got {value}")
    return value


def _mapping(value: object, what: str) -> dict:
    if not isinstance(value, dict):
        raise UserInputError(f"{what}: expected a mapping of keys, got {value!r}")
    return value


_BARE_SIZE_MINIMUM = 2**20  # a unit-less size under 1 MiB ("memory: 24") is a forgotten unit, not bytes
_BARE_NUMBER_RE = re.compile(r"^\s*[0-9]+\s*(/\s*s)?\s*$", re.IGNORECASE)


def _size(value: object, what: str, *, per_second: bool = False) -> int:
    """parse_size, refusing small unit-less numbers: `memory: 24` would plan for 24 bytes of GPU memory."""
    size = parse_size(value, what, per_second=per_second)
    bare = (isinstance(value, int) and not isinstance(value, bool)) or (
        isinstance(value, str) and _BARE_NUMBER_RE.match(value)
    )
    if bare and 0 < size < _BARE_SIZE_MINIMUM:
        unit = "GB/s" if per_second else "GiB"
        raise UserInputError(
            f"{what}: {value!r} has no unit, so it reads as {size} bytes{'/s' if per_second else ''}; "
            f"write it with a unit, e.g. '{size}{unit}'"
        )
    return size


# A link's rate as network and interconnect datasheets write it: bits (200Gb/s, 200Gbit/s, 200Gbps; decimal prefixes,
# IEEE 802.3 and the InfiniBand specification) or bytes (25GB/s, 300GB/s, 25GiB/s). `gb/s` could be either, as could
# a bare `25G/s`: refused, with the two spellings that are not.
_LINK_RATE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*?)(/\s*s|ps)\s*$")
_BIT_PREFIXES = {"": 1, "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def link_rate(value: object, what: str) -> int:
    """Bytes/s from a link's rate in bits ('200Gb/s', '100Gbit/s', '400Gbps') or bytes ('25GB/s', '300GB/s')."""
    example = "write e.g. '200Gbit/s' (bits) or '25GB/s' (bytes)"
    match = _LINK_RATE_RE.match(value) if isinstance(value, str) else None
    if match is None:
        raise UserInputError(f"{what}: cannot read {value!r} as a link's rate; {example}")
    number, unit, per = match.groups()
    prefix = unit[:-3] if unit.lower().endswith("bit") else unit[:-1] if unit.endswith("b") else None
    if prefix is not None and prefix.lower() in ("", "k", "m", "g", "t"):
        if prefix not in _BIT_PREFIXES:  # 'gb/s', 'mb/s': bits or bytes?
            raise UserInputError(f"{what}: {value!r} could mean bits or bytes; {example}")
        rate = float(number) * _BIT_PREFIXES[prefix] / 8
        if not math.isfinite(rate):
            raise UserInputError(f"{what}: {value!r} is too large to be a rate")
        return int(round(rate))
    if not unit.endswith("B"):  # a bare number, '25G/s', an unknown unit
        raise UserInputError(f"{what}: {value!r} says neither bits nor bytes; {example}")
    return parse_size(f"{number}{unit}/s", what, per_second=True)


@dataclass(frozen=True)
class _Described:
    """The description being read: its file and (YAML) key lines, to name both in every error."""

    path: str
    lines: dict[str, int]

    def at(self, key: str) -> str:
        line = self.lines.get(key)
        return f"{self.path}:{line}: {key}" if line else f"{self.path}: {key}"

    def check_keys(self, section: dict, allowed: set[str], where: str, prefix: str) -> None:
        _check_keys(section, allowed, where, self.path, self.lines, prefix)

    def rate(self, section: dict, key: str, dotted: str) -> int | None:
        return _size(section[key], self.at(dotted), per_second=True) if key in section else None


def load_host_spec(path: str) -> HostProfile:
    """A described host from YAML or JSON. Nothing on this machine is read or checked. Every error names
    the file, the key and (YAML) its line: `host.yaml:3: gpus.memory: ...`. The checks run in a fixed order
    (top level, gpus, pcie, nvme, then the host-wide sizes), so a description with several mistakes
    always reports the same one."""
    spec, described = _read(path)
    gpus = _gpus(spec, described)
    pcie = _pcie(spec, described)
    nvme = _nvme(spec, described)
    return _host(spec, described, gpus, pcie, nvme)


def _read(path: str) -> tuple[dict, _Described]:
    """The description's top-level mapping, with only known keys and the required ones present."""
    file = Path(path)
    if not file.is_file():
        raise UserInputError(f"--host-spec {path} does not exist; pass a YAML or JSON host description")
    text = textfiles.read_text(file)
    data = textfiles.parse(text, path, as_json=file.suffix == ".json")
    spec = _mapping(data, f"{path}")
    described = _Described(path, textfiles.key_lines(text) if file.suffix != ".json" else {})
    described.check_keys(spec, _TOP_KEYS, "host description", "")
    for required, example in (("gpus", "gpus: {count: 1, memory: 80GiB}"), ("cpu_memory", "cpu_memory: 512GiB")):
        if required not in spec:
            raise UserInputError(
                f"{path}: missing required key '{required}'; add it, e.g. '{example}' "
                "(see docs/recipes-and-hosts.md, 'Described hosts')"
            )
    return spec, described


def _gpus(spec: dict, described: _Described) -> GpuSpec:
    at = described.at
    gpus_raw = _mapping(spec["gpus"], at("gpus"))
    described.check_keys(gpus_raw, _GPU_KEYS, "gpus", "gpus.")
    count = int(_number(gpus_raw.get("count", 0), at("gpus.count")))
    if count and "memory" not in gpus_raw:
        raise UserInputError(
            f"{at('gpus')}: missing required key 'gpus.memory'; add the memory per GPU, e.g. 'memory: 80GiB'"
        )
    capability = str(gpus_raw.get("compute_capability", "8.0"))
    try:
        major, minor = (int(x) for x in capability.split("."))
    except ValueError:
        raise UserInputError(f"{at('gpus.compute_capability')}: must look like '8.0', got {capability!r}") from None
    tflops = gpus_raw.get("tflops")
    return GpuSpec(
        count=count,
        memory_bytes=_size(gpus_raw.get("memory", 0), at("gpus.memory")) if count else 0,
        name=str(gpus_raw.get("name", "unknown GPU" if count else "none")),
        tflops=None if tflops is None else float(_number(tflops, at("gpus.tflops"), integer=False)),
        compute_capability=(major, minor),
        interconnect_bytes_per_s=_positive_rate(gpus_raw, "interconnect", described, "gpus.interconnect"),
    )


def _pcie(spec: dict, described: _Described) -> dict:
    """The pcie section, its generation and width checked (its bandwidth is read with the host-wide sizes)."""
    at = described.at
    pcie = _mapping(spec.get("pcie", {}), at("pcie"))
    described.check_keys(pcie, _PCIE_KEYS, "pcie", "pcie.")
    generation = pcie.get("generation")
    if generation is not None and (type(generation) is not int or generation not in PCIE_X16_BYTES_PER_S):
        raise UserInputError(f"{at('pcie.generation')}: must be one of 3, 4, 5, 6; got {generation!r}")
    width = pcie.get("width")
    if width is not None and (type(width) is not int or width not in (1, 2, 4, 8, 16)):
        raise UserInputError(f"{at('pcie.width')}: must be one of 1, 2, 4, 8, 16; got {width!r}")
    return pcie


def _nvme(spec: dict, described: _Described) -> NvmeSpec | None:
    if spec.get("nvme") is None:
        return None
    at = described.at
    nvme_raw = _mapping(spec["nvme"], at("nvme"))
    described.check_keys(nvme_raw, _NVME_KEYS, "nvme", "nvme.")
    for required, example in (("path", "path: /local_nvme"), ("free", "free: 2TB")):
        if required not in nvme_raw:
            raise UserInputError(f"{at('nvme')}: missing required key 'nvme.{required}'; add it, e.g. '{example}'")
    return NvmeSpec(
        path=str(nvme_raw["path"]),
        free_bytes=_size(nvme_raw["free"], at("nvme.free")),
        is_nvme=bool(nvme_raw.get("is_nvme", True)),
        aio_usable=True,
        read_bytes_per_s=described.rate(nvme_raw, "read", "nvme.read"),
        write_bytes_per_s=described.rate(nvme_raw, "write", "nvme.write"),
    )


def _host(spec: dict, described: _Described, gpus: GpuSpec, pcie: dict, nvme: NvmeSpec | None) -> HostProfile:
    """The HostProfile: the sections read so far, and the host-wide sizes and counts read here."""
    at = described.at
    cpu_memory = _size(spec["cpu_memory"], at("cpu_memory"))
    memlock = spec.get("memlock", "unlimited")
    return HostProfile(
        source=str(described.path),
        gpus=gpus,
        nodes=int(_number(spec.get("nodes", 1), at("nodes"), minimum=1)),
        cpu_memory_bytes=cpu_memory,
        cpu_memory_available_bytes=cpu_memory,
        cpu_cores=int(_number(spec.get("cpu_cores", DEFAULT_CPU_CORES), at("cpu_cores"), minimum=1)),
        pcie_generation=pcie.get("generation"),
        pcie_width=pcie.get("width"),
        pcie_bandwidth_bytes_per_s=_link_rate(spec, described) or described.rate(pcie, "bandwidth", "pcie.bandwidth"),
        link_kind=_link(spec, described).get("kind"),
        # memlock stays parse_size: a bare 65536 bytes (64 KiB) is a real, common limit
        memlock_bytes=None if memlock == "unlimited" else parse_size(memlock, at("memlock")),
        shm_bytes=_size(spec["shm"], at("shm")) if "shm" in spec else cpu_memory // 2,
        nvme=nvme,
        cpu_flags=("avx2", "avx512f"),
        cpu_memory_bandwidth_bytes_per_s=described.rate(spec, "cpu_memory_bandwidth", "cpu_memory_bandwidth"),
        cpu_adam_params_per_s=(
            float(_number(spec["cpu_adam_params_per_s"], at("cpu_adam_params_per_s"), integer=False, minimum=1))
            if "cpu_adam_params_per_s" in spec
            else None
        ),
        network_bytes_per_s=_network(spec, described),
        notes=(f"described host {spec['name']}",) if "name" in spec else (),
    )


def _positive_rate(section: dict, key: str, described: _Described, dotted: str) -> int | None:
    """A link's rate (`link_rate`), which must be more than 0 (it divides bytes); None when the key is absent."""
    if key not in section:
        return None
    rate = link_rate(section[key], described.at(dotted))
    if rate <= 0:
        raise UserInputError(f"{described.at(dotted)}: must be more than 0, got {section[key]!r}")
    return rate


def _network(spec: dict, described: _Described) -> int | None:
    """The node's network, per direction: `bandwidth` (one NIC's rate, bits or bytes) x `nics` (how many the
    ranks use, default 1); None when not described."""
    if "network" not in spec:
        return None
    at = described.at
    network = _mapping(spec["network"], at("network"))
    described.check_keys(network, _NETWORK_KEYS, "network", "network.")
    if "bandwidth" not in network:
        raise UserInputError(
            f"{at('network')}: missing required key 'network.bandwidth'; add one NIC's rate, e.g. 'bandwidth: 200Gb/s'"
        )
    nics = int(_number(network.get("nics", 1), at("network.nics"), minimum=1))
    return _positive_rate(network, "bandwidth", described, "network.bandwidth") * nics


def _link(spec: dict, described: _Described) -> dict:
    """The link section (a superchip's coherent CPU-GPU link), its kind checked."""
    link = _mapping(spec.get("link", {}), described.at("link"))
    described.check_keys(link, _LINK_KEYS, "link", "link.")
    if "link" in spec and link.get("kind") not in LINK_KINDS:
        raise UserInputError(
            f"{described.at('link.kind')}: must be one of {', '.join(LINK_KINDS)}; got {link.get('kind')!r}"
        )
    return link


def _link_rate(spec: dict, described: _Described) -> int | None:
    """A stated link's bandwidth per direction: the host<->device rate the time model uses in place of PCIe's."""
    return described.rate(_link(spec, described), "bandwidth", "link.bandwidth")


def with_nvme_path(host: HostProfile, nvme_path: str) -> HostProfile:
    """A described host given `--nvme-path`: keep its NVMe capacity, use the user's folder name."""
    if host.nvme is None:
        raise UserInputError(
            f"--nvme-path {nvme_path} given, but the host description {host.source} has no 'nvme' section; "
            "add nvme: {path: ..., free: ...} to it"
        )
    return replace(host, nvme=replace(host.nvme, path=nvme_path))
