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


@pytest.mark.parametrize(
    ("text", "release"),
    [
        ("cuda: Optional[str] = '12.8'\nhip: Optional[str] = None\n", "12.8"),
        ('cuda = "11.8"\n', "11.8"),
        ("__version__ = '2.13.0+cpu'\ncuda: Optional[str] = None\n", ""),  # the CPU build
        ("__version__ = '2.13.0'\n", None),  # says nothing
    ],
)
def test_the_torch_build_is_read_from_its_version_file(text, release):
    from launcher.inspection.host import cuda_release

    assert cuda_release(text) == release


def test_the_installed_torch_is_read_without_importing_it():
    import subprocess
    import sys

    code = (
        "import sys; from launcher.inspection.host import torch_cuda_build as b; "
        "print(repr(b()), 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    import torch

    assert out == [repr(torch.version.cuda or ""), "False"]


def test_gpus_with_a_cpu_build_of_torch_is_one_line_with_the_install_command(monkeypatch, tiny_llama_dir):
    """NVML sees GPUs (a fake one: this machine has none), the installed torch is the CPU build (this machine's):
    exit 2 with what to install, before anything is planned; CUDA_VISIBLE_DEVICES='' plans for the CPU instead."""
    import sys

    from click.testing import CliRunner

    from launcher.cli import cli
    from tests.inspection.test_cuda_devices import FakeNvml, four_gpus

    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(four_gpus()))
    result = CliRunner().invoke(cli, ["--model", str(tiny_llama_dir), "--dry-run"])
    assert result.exit_code == 2, result.output
    (line,) = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert "4 NVIDIA GPU(s)" in line and "is a CPU build" in line and "download.pytorch.org/whl/cu" in line
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert CliRunner().invoke(cli, ["--model", str(tiny_llama_dir), "--dry-run"]).exit_code == 0


def test_the_host_identity_survives_a_few_mib_of_ram_drift(monkeypatch):
    """A VM reports a few MiB more or less RAM after a reboot: the same machine, the same cached measurements."""
    from collections import namedtuple

    import psutil

    from launcher.inspection.host import host_id

    memory = namedtuple("memory", "total available")
    monkeypatch.setattr(psutil, "virtual_memory", lambda: memory(24 * 2**30 + 3 * 2**20, 0))
    before = host_id()
    monkeypatch.setattr(psutil, "virtual_memory", lambda: memory(24 * 2**30 - 5 * 2**20, 0))
    assert host_id() == before
    monkeypatch.setattr(psutil, "virtual_memory", lambda: memory(32 * 2**30, 0))
    assert host_id() != before  # more RAM installed: another machine for the cache


def test_a_usable_op_is_asked_once_per_environment_and_a_missing_one_every_time(monkeypatch, tmp_path):
    """op_usable's child imports DeepSpeed and torch (seconds): a yes is kept in the tool's cache, a no is not."""
    import json
    import subprocess

    from launcher.inspection import host

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    host.op_usable.cache_clear()
    assert host.op_usable("CPUAdamBuilder")  # a real child: g++, ninja and DeepSpeed's check, as make install sets up
    kept = json.loads((tmp_path / "offload-launch" / host.OPS_CACHE_FILE).read_text())
    assert list(kept.values()) == [{"CPUAdamBuilder": True}]
    host.op_usable.cache_clear()
    children = []
    real_run = subprocess.run
    monkeypatch.setattr(host.subprocess, "run", lambda argv, **kw: children.append(argv) or real_run(argv, **kw))
    assert host.op_usable("CPUAdamBuilder") and children == []  # from the cache
    assert not host.op_usable("NoSuchBuilder") and len(children) == 1  # asked, refused, not kept
    host.op_usable.cache_clear()
    assert not host.op_usable("NoSuchBuilder") and len(children) == 2
    host.op_usable.cache_clear()


def test_a_dry_run_with_data_imports_neither_torch_nor_deepspeed(tiny_llama_dir, tmp_path):
    """Once the model is profiled and its config validated (both cached: the first dry run builds the model on the
    meta device and asks DeepSpeed's config classes), the plan, the layout of the data and the host's checks come
    from files and small children: a dry run takes about a second, not the ten that importing torch, a model's
    module and DeepSpeed took."""
    import json
    import subprocess
    import sys

    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"text": "hello world"}) + "\n")
    argv = ["--model", str(tiny_llama_dir), "--data", str(data), "--output-dir", str(tmp_path / "o"), "--dry-run"]
    argv += ["--offload-optimizer", "cpu", "--zero-stage", "2"]  # the CPU-Adam check too
    code = (
        "import sys; from launcher.cli.app import main\n"
        f"sys.argv = ['offload-launch', *{argv!r}]\n"
        "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        "print(sorted(m for m in ('torch', 'deepspeed') if m in sys.modules), file=sys.stderr)"
    )
    first, again = (subprocess.run([sys.executable, "-c", code], capture_output=True, text=True) for _ in range(2))
    assert first.returncode == 0, first.stderr[-2000:]
    assert again.returncode == 0 and again.stderr.strip().splitlines()[-1] == "[]", again.stderr[-2000:]
