"""`python -m launcher.rank --run-spec OUT/run_spec.json`: what DeepSpeed's launcher starts on every rank."""

import os
import sys

from launcher.inspection.cuda_devices import RANK_DEVICES_ENV, VISIBLE_DEVICES_ENV

# A MIG instance named by UUID: DeepSpeed's launch.py set CUDA_VISIBLE_DEVICES to its GPU's index, which CUDA reads
# as that GPU's first instance; the instance the user chose comes in RANK_DEVICES_ENV, set before CUDA starts
if os.environ.get(RANK_DEVICES_ENV):
    os.environ[VISIBLE_DEVICES_ENV] = os.environ[RANK_DEVICES_ENV]

from launcher.rank.main import main  # noqa: E402  (after the device selection above)

# Guarded: ZenFlow's optimizer worker is a multiprocessing "spawn" child, which imports this module again as
# __mp_main__; unguarded, it would start a second training rank.
if __name__ == "__main__":
    code = main()
    # Every file is written (atomically) and the process group destroyed by now. Skip the interpreter's teardown:
    # gloo's worker threads can still hold tensors whose destructors need the GIL while finalization tears it
    # down, and the rank dies of SIGABRT ("terminate called without an active exception") after a run that
    # succeeded; a CI run of this suite hit it once after export (pytorch/pytorch#179291, #190489 describe the race).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
