"""Measuring in a process of its own, which exits before anything else starts: the CLI never touches a GPU.

The probe copies through a 512 MB pinned buffer and times matmuls on the GPU, the passes move a model cut to three
blocks onto it, and CUDA keeps a context (about 0.5 GiB) and every cached block for as long as the process lives. Done
in the CLI, that memory stayed taken on GPU 0 while the ranks trained beside it, and the plan had read the GPU's free
memory before it was taken. So `python -m launcher.job.measuring_process REQUEST` does the measuring
(job/measuring.py) and writes the cache; the CLI relays its lines, waits for it to exit, and then plans again from
the cache. The child dies with the CLI (PR_SET_PDEATHSIG), taking its process group (a JIT build's compilers) with
it, and a domain error in it is the CLI's one-line error.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable

from launcher.errors import OffloadLaunchError, UserInputError
from launcher.job import supervise

ERROR_PREFIX = "offload-launch-measuring-error "  # the child's last line when a domain error stopped it


def fill_cache(plan, *, model: str, nvme_path: str | None, trust_remote_code: bool, log: Callable[[str], None]):
    """job/measuring.fill_cache for `plan` (this host's, planned from the cache), in a child process. `model`: the
    --model the plan inspected (ID or folder), inspected again there."""
    workload = plan.workload
    _run(
        {
            "action": "fill",
            "model": model,
            "nvme_path": nvme_path,
            "trust_remote_code": trust_remote_code,
            "workload": {
                "micro_batch": workload.micro_batch,
                "seq_len": workload.seq_len,
                "activation_checkpointing": workload.activation_checkpointing,
            },
            "ranks": plan.ranks_per_node,
        },
        log,
    )


def probe(nvme_path: str | None, *, quick: bool, log: Callable[[str], None], model: str | None, tokens: int):
    """`offload-launch probe` (job/measuring.probe_and_cache) in a child process: (ProbeResult, cache path)."""
    from launcher.files import tool_cache_dir
    from launcher.inspection.host import host_id
    from launcher.measure import cache
    from launcher.measure.probe import ProbeResult

    request = {"action": "probe", "nvme_path": nvme_path, "quick": quick, "model": model, "tokens": tokens}
    _run(request, log)
    path = cache.probe_path(tool_cache_dir())
    return ProbeResult(**cache.load_probe(path, host_id())), path


def _run(request: dict, log: Callable[[str], None]) -> None:
    """The child on `request`, its output (DeepSpeed's and the JIT compiler's included) relayed line by line to
    `log`; its domain error raised here as the same one-line error."""
    child = subprocess.Popen(
        [sys.executable, "-m", "launcher.job.measuring_process", json.dumps(request)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its group: the compilers a JIT build starts go with it
        preexec_fn=supervise.die_with_parent,
    )
    last, error = "", None
    try:
        for line in child.stdout:
            line = line.rstrip("\n")
            if line.startswith(ERROR_PREFIX):
                error = json.loads(line[len(ERROR_PREFIX) :])
            elif line:
                log(line)
                last = line
        code = child.wait()
    finally:  # Ctrl-C, or a SIGTERM the tool turned into an exception: the measuring stops with it
        if child.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    if error is not None:
        raise (UserInputError if error["user"] else OffloadLaunchError)(error["message"])
    if code != 0:
        raise OffloadLaunchError(f"measuring this host failed (exit {code}): {last or 'no output'}")


def _child(request: dict) -> None:
    from launcher.cpuinfo_once import ask_cpuinfo_once
    from launcher.files import tool_cache_dir
    from launcher.inspection.host import inspect_host
    from launcher.inspection.model import inspect_model
    from launcher.job import measuring
    from launcher.plan.workload import Workload

    def log(line: str) -> None:
        print(line, flush=True)

    ask_cpuinfo_once()  # the measurements load DeepSpeed's ops (cpu_adam, async_io)
    if request["action"] == "probe":
        measuring.probe_and_cache(
            request["nvme_path"], quick=request["quick"], log=log, model=request["model"], tokens=request["tokens"]
        )
        return
    trust = request["trust_remote_code"]
    measuring.fill_cache(
        inspect_host(request["nvme_path"]),
        inspect_model(request["model"], trust_remote_code=trust, cache_dir=tool_cache_dir()),
        Workload(**request["workload"]),
        ranks=request["ranks"],
        nvme_path=request["nvme_path"],
        trust_remote_code=trust,
        log=log,
    )


def _stop_with_the_group(_signum, _frame) -> None:
    """SIGTERM (the CLI died: PR_SET_PDEATHSIG): this process and what it started (a JIT build's ninja and
    compilers, which would otherwise finish orphaned and leave torch's build lock held)."""
    os.killpg(os.getpgrp(), signal.SIGKILL)


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGTERM, _stop_with_the_group)
    try:
        _child(json.loads(argv[0]))
    except OffloadLaunchError as exc:
        message = {"message": str(exc), "user": isinstance(exc, UserInputError)}
        print(ERROR_PREFIX + json.dumps(message), flush=True)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
