"""Described hosts (--host-spec): every key read, the shipped descriptions load, each mistake is one error
naming the file, the key and its line."""

from __future__ import annotations

import pytest

from launcher.errors import UserInputError
from launcher.inspection.hostspec import load_host_spec, with_nvme_path
from tests.helpers import HOSTS

A100 = """\
gpus: {count: 8, memory: 80GiB, name: NVIDIA A100-SXM4-80GB, tflops: 312}
nodes: 2
cpu_memory: 1TiB
cpu_cores: 64
pcie: {generation: 4, width: 16}
nvme: {path: /local_nvme/offload, free: 4TB}
"""


def test_described_host_reads_every_key(write_host):
    host = load_host_spec(write_host(A100))
    assert host.gpus.count == 8 and host.gpus.memory_bytes == 80 * 2**30 and host.gpus.tflops == 312
    assert host.nodes == 2 and host.world_size == 16
    assert host.cpu_memory_bytes == 2**40 == host.cpu_memory_available_bytes
    assert host.pcie_bytes_per_s == 32 * 10**9  # seeds: PCIe 4.0 x16 ~32 GB/s
    assert host.nvme.path == "/local_nvme/offload" and host.nvme.free_bytes == 4 * 10**12
    assert host.memlock_bytes is None  # unlimited unless described


def test_json_host_and_explicit_bandwidth(write_host):
    text = '{"gpus": {"count": 1, "memory": 25769803776}, "cpu_memory": "64GB", "pcie": {"bandwidth": "12GB/s"}}'
    host = load_host_spec(write_host(text, "h.json"))
    assert host.gpus.memory_bytes == 24 * 2**30
    assert host.pcie_bytes_per_s == 12 * 10**9
    assert host.nvme is None


def test_cpu_only_description():
    host = load_host_spec(str(HOSTS / "cpu-only.yaml"))
    assert not host.has_gpu and host.ranks_per_node == 1 and host.accelerator == "cpu"


@pytest.mark.parametrize("path", sorted(HOSTS.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_host_description_loads(path):
    host = load_host_spec(str(path))
    assert host.cpu_memory_bytes > 0
    assert host.gpus.count == 0 or host.gpus.memory_bytes >= 16 * 2**30


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "gpus: {count: 1, memory: 24GiB}\ncpu_memory: 64GiB\ncpu_memroy: 1\n",
            r"unknown key 'cpu_memroy' in host description \(.*host.yaml:3\); did you mean 'cpu_memory'\?",
        ),
        (
            "gpus: {count: 1, memory: 24GiB, memroy: 1}\ncpu_memory: 64GiB\n",
            r"unknown key 'memroy' in gpus .*:1\); did you mean 'memory'\?",
        ),
        ("gpus: {count: 1, memory: 24GiB}\n", "missing required key 'cpu_memory'"),
        ("gpus: {count: 1}\ncpu_memory: 64GiB\n", "missing required key 'gpus.memory'"),
        ("gpus: {count: 1, memory: -24GiB}\ncpu_memory: 64GiB\n", "gpus.memory: size must not be negative"),
        ("gpus: {count: 1, memory: 24.5}\ncpu_memory: 64GiB\n", "gpus.memory: a bare number 24.5 has no unit"),
        ("gpus: {count: 1, memory: 24GiB}\ncpu_memory: 64GiB\npcie: {bandwidth: 25GB}\n", "needs '/s'"),
        ("gpus: {count: 1, memory: 24GiB\ncpu_memory: 64GiB\n", r"host.yaml:\d+: invalid YAML"),
        ("gpus: {count: 1, memory: 24GiB}\ncpu_memory: 64GiB\nnvme: {path: /x}\n", "missing required key 'nvme.free'"),
    ],
)
def test_described_host_errors(write_host, text, message):
    with pytest.raises(UserInputError, match=message):
        load_host_spec(write_host(text))


def test_missing_host_spec_file(tmp_path):
    with pytest.raises(UserInputError, match="does not exist"):
        load_host_spec(str(tmp_path / "nope.yaml"))


def test_nvme_path_renames_the_described_folder_only(write_host):
    host = with_nvme_path(load_host_spec(write_host(A100)), "/scratch/run")
    assert host.nvme.path == "/scratch/run" and host.nvme.free_bytes == 4 * 10**12
    no_nvme = load_host_spec(str(HOSTS / "cpu-only.yaml"))
    with pytest.raises(UserInputError, match="has no 'nvme' section; add nvme: {path: ..., free: ...} to it"):
        with_nvme_path(no_nvme, "/scratch/run")


# ------------------------------------------------------------------------------------ links: network, GPU interconnect

TWO_NODES = "gpus: {count: 8, memory: 80GiB}\ncpu_memory: 1TiB\nnodes: 2\n"


@pytest.mark.parametrize(
    ("bandwidth", "bytes_per_s"),
    [
        ("200Gb/s", 25 * 10**9),  # bits: 200e9 b/s / 8 = 25e9 B/s (InfiniBand HDR)
        ("100Gbit/s", 12_500_000_000),  # 100e9 / 8
        ("400Gbps", 50 * 10**9),  # 400e9 / 8 (NDR)
        ("25Gb/s", 3_125_000_000),  # 25 GbE: 25e9 / 8
        ("800Mb/s", 100 * 10**6),  # 800e6 / 8
        ("25GB/s", 25 * 10**9),  # bytes, as the PCIe rates
        ("12.5 GB/s", 12_500_000_000),
        ("2GiB/s", 2 * 2**30),
    ],
)
def test_the_network_is_read_in_bits_or_bytes(write_host, bandwidth, bytes_per_s):
    host = load_host_spec(write_host(TWO_NODES + f"network: {{bandwidth: {bandwidth}}}\n"))
    assert host.network_bytes_per_s == bytes_per_s
    assert host.to_json()["network_bytes_per_s"] == bytes_per_s


def test_a_nodes_nics_add_up_and_the_gpus_links_are_read(write_host):
    # a DGX A100: 8 x 200 Gb/s HDR for compute = 1.6 Tb/s = 200 GB/s per node; NVLink 3: 300 GB/s per GPU each way
    host = load_host_spec(
        write_host(
            "gpus: {count: 8, memory: 80GiB, interconnect: 300GB/s}\ncpu_memory: 1TiB\nnodes: 2\n"
            "network: {bandwidth: 200Gb/s, nics: 8}\n"
        )
    )
    assert host.network_bytes_per_s == 200 * 10**9
    assert host.gpus.interconnect_bytes_per_s == 300 * 10**9
    assert host.to_json()["gpus"]["interconnect_bytes_per_s"] == 300 * 10**9


def test_links_not_described_are_none(write_host):
    host = load_host_spec(write_host(A100))
    assert host.network_bytes_per_s is None and host.gpus.interconnect_bytes_per_s is None
    assert host.to_json()["network_bytes_per_s"] is None


def test_the_shipped_two_node_hosts_state_their_network():
    ib = load_host_spec(str(HOSTS / "2x-node-8x-a100-80g-ib.yaml"))
    ethernet = load_host_spec(str(HOSTS / "2x-node-8x-a100-80g-25gbe.yaml"))
    assert ib.nodes == ethernet.nodes == 2 and ib.world_size == 16
    assert ib.network_bytes_per_s == 8 * 200 * 10**9 // 8  # 8 HDR NICs: 200 GB/s each way
    assert ethernet.network_bytes_per_s == 25 * 10**9 // 8  # one 25 GbE port: 3.125 GB/s
    assert ib.gpus.interconnect_bytes_per_s == ethernet.gpus.interconnect_bytes_per_s == 300 * 10**9


@pytest.mark.parametrize(
    ("network", "message"),
    [
        ("{bandwidth: 25gb/s}", r"host.yaml:4: network.bandwidth: '25gb/s' could mean bits or bytes; write e.g."),
        ("{bandwidth: 25G/s}", "'25G/s' says neither bits nor bytes"),
        ("{bandwidth: 25}", "cannot read 25 as a link's rate"),
        ("{bandwidth: 25Gb}", "cannot read '25Gb' as a link's rate"),
        ("{bandwidth: 0Gb/s}", "network.bandwidth: must be more than 0"),
        ("{nics: 8}", "missing required key 'network.bandwidth'"),
        ("{bandwidth: 200Gb/s, nics: 0}", "network.nics: must be at least 1"),
        ("{bandwidth: 200Gb/s, nic: 8}", r"unknown key 'nic' in network .*did you mean 'nics'\?"),
        ("200Gb/s", "network: expected a mapping of keys"),
    ],
)
def test_network_errors(write_host, network, message):
    with pytest.raises(UserInputError, match=message):
        load_host_spec(write_host(TWO_NODES + f"network: {network}\n"))


def test_interconnect_errors(write_host):
    with pytest.raises(UserInputError, match=r"host.yaml:1: gpus.interconnect: '300gb/s' could mean bits or bytes"):
        load_host_spec(write_host("gpus: {count: 8, memory: 80GiB, interconnect: 300gb/s}\ncpu_memory: 1TiB\n"))
