"""Whether a measurement had this host's cores to itself.

Right before and right after a measurement, a fixed burst of fp32 matrix products runs on the threads the measurement
uses: BLAS keeps every thread busy, so the burst's CPU time (this process, all threads: getrusage RUSAGE_SELF) over
its wall time times the threads is the share of those cores this process gets. Measured on the 2-core development
host with 2 threads: 1.00 idle, 0.71 with one other busy process, 0.55 with two (0.33 when they run in their own
sessions: the kernel's autogroup scheduling). The measurement itself is not a good gauge: a small model's passes keep
2 threads 63 % busy on an idle host. A measurement whose lower share is under CONTENDED_SHARE was taken while other
work competed for the cores: it predicts that moment, not this host (runs measured 2.2-2.5x faster than plans made
from such figures), so the measuring code says so and keeps it only as "measured under load": a plan may use it (and
says so), and the next real run measures it again.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable
from typing import TypeVar

CONTENDED_SHARE = 0.85
BURST_SECONDS = 0.2  # each gauge's length: about 60 products of 512 x 512 on the development host's 2 cores

T = TypeVar("T")


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def core_share(threads: int, seconds: float = BURST_SECONDS) -> float:
    """The share of `threads` cores this process gets now: fp32 products on `threads` threads for about `seconds`."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(max(1, threads))
    try:
        a = torch.randn(512, 512)
        a @ a  # warm-up: the thread pool starts
        wall, cpu = time.perf_counter(), _cpu_seconds()
        while time.perf_counter() - wall < seconds:
            a @ a
        wall, cpu = time.perf_counter() - wall, _cpu_seconds() - cpu
    finally:
        torch.set_num_threads(previous)
    return cpu / (wall * max(1, threads))


def gauged(action: Callable[[], T], threads: int) -> tuple[T, float]:
    """(what `action` returns, the lower core share around it)."""
    before = core_share(threads)
    result = action()
    return result, min(before, core_share(threads))


def contended(share: float | None) -> bool:
    """A share (as a measurement records it) below CONTENDED_SHARE; None (not gauged) is not."""
    return share is not None and share < CONTENDED_SHARE


def note(what: str, share: float, threads: int) -> str:
    """The line a contended measurement logs."""
    return (
        f"{what} measured while other processes competed for the cores (this process got {share:.0%} of its "
        f"{threads} thread(s)): kept as measured under load, so this plan uses it and the next run measures it again"
    )
