"""Which rank ran where, and which ones never said they ended: how a stopped multi-node run names the node that
died.

Every rank writes OUT/ranks/rank<N>.json when it starts (its host, node, pid) and again when it ends in any way
it can still report (a return, an exception, a SystemExit), all in the shared output folder. A rank that is
SIGKILLed, or whose machine loses power or network, cannot write its end: after the run stops, the ranks that
started but never ended are the lost ones, and their nodes are named in the stop message. The CLI empties the
folder before each launch.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from launcher.files import write_json_atomic

RANKS_DIR = "ranks"


def _path(out: Path, rank: int) -> Path:
    return Path(out) / RANKS_DIR / f"rank{rank}.json"


def started(out: Path, rank: int, node: int, host: str) -> None:
    """This rank is running (rank side, first thing)."""
    (Path(out) / RANKS_DIR).mkdir(parents=True, exist_ok=True)
    write_json_atomic(
        _path(out, rank), {"rank": rank, "node": node, "host": host, "pid": os.getpid(), "started": time.time()}
    )


def ended(out: Path, rank: int, how: str) -> None:
    """This rank is ending (rank side, last thing): `how` says in a few words ("returned 0", "raised ...")."""
    path = _path(out, rank)
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    write_json_atomic(path, {**record, "ended": time.time(), "how": how})


def clear(out: Path) -> None:
    """Before a launch: no record of an earlier one may be taken for this one's."""
    shutil.rmtree(Path(out) / RANKS_DIR, ignore_errors=True)


def lost(out: Path) -> list[dict]:
    """The records of the ranks that started and never ended, by rank."""
    found = []
    folder = Path(out) / RANKS_DIR
    for path in sorted(folder.glob("rank*.json")) if folder.is_dir() else []:
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if "ended" not in record:
            found.append(record)
    return sorted(found, key=lambda r: r["rank"])


def lost_nodes(out: Path, hosts: list[str] | None = None) -> str | None:
    """'node 1 (gpu-b): rank 1', the lost ranks by node, for the stop message; None when none was lost. `hosts`:
    the hostfile's, in its order (which numbers the nodes), named as the user wrote them, with the machine's own
    name beside where it differs."""
    by_node: dict[tuple[int, str], list[int]] = {}
    for record in lost(out):
        by_node.setdefault((record["node"], record["host"]), []).append(record["rank"])
    if not by_node:
        return None

    def name(node: int, host: str) -> str:
        listed = hosts[node] if hosts and node < len(hosts) else None
        return host if listed in (None, host) else f"{listed}, hostname {host}"

    return "; ".join(
        f"node {node} ({name(node, host)}): rank{'s' if len(r) > 1 else ''} {', '.join(map(str, r))}"
        for (node, host), r in sorted(by_node.items())
    )
