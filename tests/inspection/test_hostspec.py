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
