"""Whether a measurement had this host's cores to itself.

A timed section's CPU time (this process and all its threads: getrusage RUSAGE_SELF) over its wall time times the
threads it ran with is the share of those cores it got. Measured on the 2-core development host, torch matmuls on 2
threads: 1.00 idle, 0.71 with one other busy process, 0.55 with two. A rate measured with less than CONTENDED_SHARE
was taken while other work competed for the cores: it predicts that moment, not this host (runs measured 2.2-2.5x
faster than plans made from such figures), so the measuring code says so and keeps it only as "measured under load":
a plan may use it (and says so), and the next real run measures it again.
"""

from __future__ import annotations

import resource
import time

CONTENDED_SHARE = 0.85


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class CoreShare:
    """`with CoreShare(threads) as share:` times the block; `share.share` is the fraction of `threads` cores it got."""

    def __init__(self, threads: int):
        self.threads = max(1, threads)
        self.share: float | None = None

    def __enter__(self) -> CoreShare:
        self._wall, self._cpu = time.perf_counter(), _cpu_seconds()
        return self

    def __exit__(self, *exc) -> None:
        wall = time.perf_counter() - self._wall
        self.share = (_cpu_seconds() - self._cpu) / (wall * self.threads) if wall > 0 else None

    @property
    def contended(self) -> bool:
        return self.share is not None and self.share < CONTENDED_SHARE


def contended(share: float | None) -> bool:
    """A share (CoreShare.share, as a measurement records it) below CONTENDED_SHARE; None (not measured) is not."""
    return share is not None and share < CONTENDED_SHARE


def note(what: str, share: float, threads: int) -> str:
    """The line a contended measurement logs."""
    return (
        f"{what} measured while other processes competed for the cores (it got {share:.0%} of its {threads} "
        "thread(s)): kept as measured under load, so this plan uses it and the next run measures it again"
    )
