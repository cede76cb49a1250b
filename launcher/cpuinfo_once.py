"""py-cpuinfo asked once per boot: DeepSpeed's op builders ask it again for every op a process loads.

`OpBuilder.cpu_arch()` and `simd_width()` (deepspeed/ops/op_builder/builder.py, 0.19.8) each call
`cpuinfo.get_cpu_info()`, and CPU builders call both from `cxx_args()` whenever `load()` JIT-loads an op
(cpu_adam, shm_comm, async_io), even one already compiled. py-cpuinfo reads CPUID in a child Python process on every
call: 1.19 s each here, measured, and a rank that loads cpu_adam and shm_comm asked it three times (3.5 s of a
19.5 s tiny-model run, by cProfile). The answer cannot change without a reboot, so it is kept in the tool's cache
keyed by the kernel's boot id and handed back from memory within a process.
"""

from __future__ import annotations

import contextlib
import functools
import json
from pathlib import Path

from launcher.files import tool_cache_dir, write_json_atomic

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
CACHE_NAME = "cpuinfo.json"


def _boot_id() -> str | None:
    try:
        return BOOT_ID.read_text().strip()
    except OSError:
        return None


def _cached_info(ask, cache: Path) -> dict:
    """`ask()`'s answer for this boot, from `cache` when it holds one, else asked and stored."""
    boot = _boot_id()
    with contextlib.suppress(OSError, ValueError, KeyError, AttributeError):  # none yet, or a torn one: ask again
        saved = json.loads(cache.read_text())
        if boot and saved.get("boot_id") == boot:
            return saved["info"]
    info = ask()
    if boot:  # a read-only cache costs the next process one more question, nothing else
        with contextlib.suppress(OSError):
            write_json_atomic(cache, {"boot_id": boot, "info": info})
    return info


def ask_cpuinfo_once() -> None:
    """Make `cpuinfo.get_cpu_info` answer from this boot's cached answer (a copy each call, so a caller that edits
    it changes nothing for the next). Does nothing without py-cpuinfo, and nothing the second time."""
    try:
        import cpuinfo
    except ImportError:
        return
    if getattr(cpuinfo.get_cpu_info, "asked_once", False):
        return
    once = functools.cache(functools.partial(_cached_info, cpuinfo.get_cpu_info, tool_cache_dir() / CACHE_NAME))

    def get_cpu_info() -> dict:
        return dict(once())

    get_cpu_info.asked_once = True
    cpuinfo.get_cpu_info = get_cpu_info
