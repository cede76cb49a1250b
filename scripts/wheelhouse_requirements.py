"""The pinned requirements scripts/wheelhouse.sh downloads, from pip's installation report (`pip install --dry-run
--report`): every package it would install except DeepSpeed and this package (built apart), the names in SKIP, and
the CUDA stack that comes with torch (nvidia-cublas-cu12, cuda-bindings, ...), which the GPU host already has.
nvidia-ml-py is kept: it is NVML's Python binding, a dependency of this package, not part of torch's CUDA stack.

    python scripts/wheelhouse_requirements.py REPORT.json "torch transformers ..." > reqs.txt
"""

from __future__ import annotations

import json
import sys

BUILT_APART = ("deepspeed", "offload-launch")
CUDA_STACK_PREFIXES = ("nvidia-", "cuda-")
NOT_CUDA_STACK = ("nvidia-ml-py",)


def requirements(report: dict, skip: list[str]) -> list[str]:
    lines = []
    for item in report["install"]:
        meta = item["metadata"]
        name = meta["name"].lower().replace("_", "-")
        cuda_stack = name.startswith(CUDA_STACK_PREFIXES) and name not in NOT_CUDA_STACK
        if name in BUILT_APART or name in skip or cuda_stack:
            continue
        lines.append(f"{name}=={meta['version']}")
    return lines


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print("\n".join(requirements(json.load(f), sys.argv[2].split())))
