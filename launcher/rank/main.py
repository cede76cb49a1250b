"""Per-rank training entry point, started by DeepSpeed's launcher:

    python -m deepspeed.launcher.runner ... --no_local_rank --module launcher.rank --run-spec OUT/run_spec.json

It knows nothing about planning: it reads a run spec (paths, steps, seed) and OUT/ds_config.json, so a
user can also start it under their own launcher. Every rank runs this file; rank 0 writes the files:
OUT/run.json after a training run, OUT/smoke.json after a smoke run.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path

from launcher.cpuinfo_once import ask_cpuinfo_once
from launcher.files import write_json_atomic
from launcher.job import ranks
from launcher.job.rundir import SUMMARY_FILE
from launcher.job.smoke import RESULT_FILE
from launcher.job.spec import RunSpec, node_rank
from launcher.rank.smoke_checks import run_checks
from launcher.rank.trainer import Trainer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-spec", required=True, help="OUT/run_spec.json written by offload-launch")
    args = parser.parse_args(argv)
    if not Path(args.run_spec).is_file():  # another node, without the folder the launching node wrote it to
        raise SystemExit(
            f"[offload-launch] {args.run_spec} is not on host {socket.gethostname()}: with --hostfile, --output-dir "
            "must be a folder every node sees at the same path (a shared file system)"
        )
    spec = RunSpec.load(args.run_spec)
    ask_cpuinfo_once()  # before DeepSpeed loads its ops (cpu_adam, shm_comm, async_io)
    rank = int(os.environ.get("RANK", "0"))
    ranks.started(spec.out, rank, node_rank(), socket.gethostname())  # how a lost rank's node gets named
    how = "returned 0"
    try:
        return _run(spec)
    except BaseException as exc:
        how = f"raised {type(exc).__name__}"
        raise
    finally:
        ranks.ended(spec.out, rank, how)


def _run(spec: RunSpec) -> int:
    trainer = Trainer(spec)
    try:
        if spec.smoke:
            checks = run_checks(trainer)
            if trainer.rank == 0:
                write_json_atomic(spec.out / RESULT_FILE, {"checks": checks})
            return 0
        summary = trainer.fit()
        if trainer.rank == 0:
            write_json_atomic(spec.out / SUMMARY_FILE, summary)
    finally:
        trainer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
