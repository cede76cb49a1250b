"""py-cpuinfo asked once per boot (launcher/cpuinfo_once.py): the cache answers for this boot id only."""

from __future__ import annotations

import json

import pytest

from launcher import cpuinfo_once


def test_asked_once_per_boot_and_again_after_a_reboot(tmp_path, monkeypatch):
    boot = tmp_path / "boot_id"
    boot.write_text("boot-a\n")
    monkeypatch.setattr(cpuinfo_once, "BOOT_ID", boot)
    cache, asked = tmp_path / "cpuinfo.json", []

    def ask():
        asked.append(1)
        return {"arch": "X86_64", "flags": ["avx2"], "asked": len(asked)}

    assert cpuinfo_once._cached_info(ask, cache)["asked"] == 1
    assert cpuinfo_once._cached_info(ask, cache)["asked"] == 1  # another process, the same boot: from the file
    assert json.loads(cache.read_text())["boot_id"] == "boot-a"
    boot.write_text("boot-b\n")  # rebooted (maybe onto another CPU): asked again
    assert cpuinfo_once._cached_info(ask, cache)["asked"] == 2 and len(asked) == 2


def test_a_corrupt_cache_is_asked_again(tmp_path, monkeypatch):
    boot = tmp_path / "boot_id"
    boot.write_text("boot-a\n")
    monkeypatch.setattr(cpuinfo_once, "BOOT_ID", boot)
    cache = tmp_path / "cpuinfo.json"
    cache.write_text("{half a file")
    assert cpuinfo_once._cached_info(lambda: {"arch": "ARM_8"}, cache) == {"arch": "ARM_8"}


def test_deepspeed_s_builders_get_the_real_answer_from_memory(tmp_path, monkeypatch):
    cpuinfo = pytest.importorskip("cpuinfo")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(cpuinfo, "get_cpu_info", cpuinfo.get_cpu_info)  # undone after the test
    cpuinfo_once.ask_cpuinfo_once()
    cpuinfo_once.ask_cpuinfo_once()  # the second call changes nothing
    first = cpuinfo.get_cpu_info()
    first["arch"] = "edited by a caller"
    from deepspeed.ops.op_builder.cpu import CPUAdamBuilder

    flags = CPUAdamBuilder().cxx_args()  # what a rank's load() asks: -march and the SIMD width
    assert any(f.startswith("-march") or f.startswith("-mcpu") for f in flags)
    assert cpuinfo.get_cpu_info()["arch"] != "edited by a caller"
    assert (tmp_path / "offload-launch" / cpuinfo_once.CACHE_NAME).is_file()
