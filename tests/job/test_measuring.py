"""job/measuring.py and job/planning.py on the NVMe figures: they belong to the drive measured, so another folder
on it needs no new measurement, and a folder on another drive gets nominal figures until its drive is measured."""

from __future__ import annotations

from launcher.files import tool_cache_dir
from launcher.inspection.host import host_id, inspect_host
from launcher.inspection.model import inspect_model
from launcher.job.measuring import drive_probed
from launcher.job.planning import host_rates
from launcher.measure import cache
from launcher.measure.probe import nvme_mount
from launcher.plan.workload import Workload, resolve
from tests.helpers import save_config, tiny_llama_config


def probe_of(folder) -> dict:
    """A cached probe of this host that measured the drive under `folder` (made-up figures, as plain data)."""
    return {
        "host_id": host_id(),
        "date": "2026-12-07T00:00:00Z",
        "figures": {
            "cpu_memory_bandwidth_bytes_per_s": 1e10,
            "nvme_read_bytes_per_s": 1.5e9,
            "nvme_write_bytes_per_s": 1e9,
        },
        "aio": {"block_size": 1048576, "queue_depth": 8},
        "details": {"nvme_path": str(folder), "nvme_mount": nvme_mount(str(folder))},
    }


def test_a_folder_on_the_measured_drive_shares_its_figures_another_drive_does_not(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    measured, sibling, elsewhere = tmp_path / "a", tmp_path / "b", "/dev/shm/offload-launch-test"
    probe = probe_of(measured)
    assert drive_probed(probe, str(measured)) and drive_probed(probe, str(sibling))
    assert nvme_mount("/dev/shm") != nvme_mount(str(measured)) and not drive_probed(probe, elsewhere)
    assert not drive_probed({"details": {"nvme_path": str(measured)}}, str(sibling))  # a probe from before mounts

    cache.save_probe(probe, cache.probe_path(tool_cache_dir()))
    model = inspect_model(str(save_config(tiny_llama_config(), tmp_path / "m")))
    host = inspect_host(None)
    resolved = resolve(Workload(seq_len=32), model, host)
    same, aio = host_rates(host, host_id(), str(sibling), model, resolved)
    assert same.nvme_read_bytes_per_s == 1.5e9 and same.sources["nvme_read_bytes_per_s"] == "measured"
    assert aio == probe["aio"]
    other, aio = host_rates(host, host_id(), elsewhere, model, resolved)
    assert other.sources["nvme_read_bytes_per_s"].startswith("nominal") and aio is None
