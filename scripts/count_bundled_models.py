"""Count every bundled model config (launcher/models/*.json) on the meta device and write the profiles into
launcher/models/profiles/, each under the name the tool cache gives it (config bytes, transformers version).

A first plan of a bundled model then reads its profile instead of importing transformers and building the
model (seconds). A profile is exact for the transformers version that counted it; under another version
the names differ and the tool counts the model itself. Rerun after changing a bundled config or the tested
transformers version (`make bundled-profiles`); tests/inspection/test_shipped_profiles.py fails until then.

    .venv/bin/python scripts/count_bundled_models.py            # rewrite launcher/models/profiles/
    .venv/bin/python scripts/count_bundled_models.py --check    # fail if it differs from a fresh count
"""

from __future__ import annotations

import argparse
import json
import sys

from launcher.files import write_json_atomic
from launcher.inspection.model import SHIPPED_PROFILES_DIR, count_bundled_models


def shipped() -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted(SHIPPED_PROFILES_DIR.glob("*.json"))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare with a fresh count, write nothing")
    args = parser.parse_args()
    counted = json.loads(json.dumps(count_bundled_models()))  # as read back: tuples become lists
    if args.check:
        if counted != shipped():
            print(f"{SHIPPED_PROFILES_DIR} is stale: run scripts/count_bundled_models.py", file=sys.stderr)
            return 1
        return 0
    for stale in set(shipped()) - set(counted):
        (SHIPPED_PROFILES_DIR / stale).unlink()
    for name, profile in counted.items():
        write_json_atomic(SHIPPED_PROFILES_DIR / name, profile)
    print(f"wrote {len(counted)} profiles to {SHIPPED_PROFILES_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
