"""`python -m launcher.rank --run-spec OUT/run_spec.json`: what DeepSpeed's launcher starts on every rank."""

import sys

from launcher.rank.main import main

sys.exit(main())
