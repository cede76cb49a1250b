"""The token cache's file: written whole or not at all, and a writer killed mid-write leaves nothing for long."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import numpy as np

from launcher.data.rows import TokenSet, read_cache, write_cache
from launcher.drills import KILL_AT_ENV

WRITE = """
import sys, numpy as np
from pathlib import Path
from launcher.data.rows import TokenSet, write_cache
write_cache(Path(sys.argv[1]), TokenSet({"input_ids": np.arange(8, dtype=np.int64).reshape(2, 4)}))
"""


def test_a_writer_killed_before_the_rename_leaves_no_cache_and_the_next_writer_clears_its_file(tmp_path):
    path = tmp_path / "cache" / "abc.npz"
    killed = subprocess.run([sys.executable, "-c", WRITE, str(path)], env={**os.environ, KILL_AT_ENV: "tokenize:0"})
    assert killed.returncode == -signal.SIGKILL
    assert not path.exists() and len(list(path.parent.glob(".abc.*.tmp"))) == 1  # whole, but never renamed
    write_cache(path, TokenSet({"input_ids": np.ones((2, 4), dtype=np.int64)}))
    assert read_cache(path, 4).arrays["input_ids"].sum() == 8
    assert list(path.parent.iterdir()) == [path]  # the dead writer's file is gone
