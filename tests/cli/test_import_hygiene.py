"""What a plan imports: the CLI starts without the heavy libraries, a first dry run of a bundled model reads its
shipped profile instead of importing transformers, and a repeated one imports neither torch nor DeepSpeed
(docs/planning.md's benchmark: a cold dry run costs about DeepSpeed's estimator, a warm one a fraction)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.helpers import REPO, host_path

HEAVY = ("torch", "transformers", "deepspeed", "datasets", "rich", "matplotlib", "jsonschema", "huggingface_hub")

# Appended to the code under test: which of the heavy libraries it imported, as the last line on stderr.
REPORT = f"\nimport json, sys\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]), file=sys.stderr)\n"
# The CLI in the process that reports (`python -m launcher` would exit before the report).
RUN_CLI = """
import sys
from launcher.cli import main
sys.argv = ["offload-launch", *sys.argv[1:]]
try:
    main()
except SystemExit as done:
    assert not done.code, done.code
"""


def imported(code: str, *args: str, cache) -> set[str]:
    """The heavy libraries `code ARGS` imported, run in a fresh process with the tool cache `cache`."""
    env = dict(os.environ, XDG_CACHE_HOME=str(cache), PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-c", code + REPORT, *args], capture_output=True, text=True, timeout=300, cwd=REPO, env=env
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return set(json.loads(proc.stderr.splitlines()[-1]))


def test_importing_the_cli_imports_no_heavy_library(tmp_path):
    assert imported("import launcher.cli", cache=tmp_path) == set()


def test_a_bundled_model_dry_run_imports_only_what_it_needs(tmp_path):
    args = ("--model", "meta-llama/Llama-2-7b", "--dry-run", "--json", "--host-spec", host_path("1x-a100-80g"))
    cold = imported(RUN_CLI, *args, cache=tmp_path)
    assert "transformers" not in cold  # the shipped profile (tests/inspection/test_shipped_profiles.py)
    assert cold <= {"torch", "deepspeed", "jsonschema", "huggingface_hub"}  # DeepSpeed validates the config
    warm = imported(RUN_CLI, *args, cache=tmp_path)
    assert warm <= {"jsonschema", "huggingface_hub"}  # DeepSpeed's verdict on this config is cached
