"""The profiles shipped for the bundled configs (launcher/models/profiles/) are what counting each bundled
config on the meta device gives under the installed transformers, so reading one plans exactly as counting."""

from __future__ import annotations

import json
from dataclasses import asdict

from launcher.inspection.model import SHIPPED_PROFILES_DIR, count_bundled_models, inspect_model


def test_shipped_profiles_are_a_fresh_count():
    shipped = {p.name: json.loads(p.read_text()) for p in SHIPPED_PROFILES_DIR.glob("*.json")}
    counted = json.loads(json.dumps(count_bundled_models()))  # as read back: tuples become lists
    assert shipped == counted, f"{SHIPPED_PROFILES_DIR} is stale: run scripts/count_bundled_models.py"


def test_a_shipped_profile_reads_back_as_the_count(tmp_path):
    cached = inspect_model("meta-llama/Llama-2-7b", cache_dir=tmp_path)
    assert cached == inspect_model("meta-llama/Llama-2-7b")
    assert asdict(cached)["config_dir"].endswith("meta-llama--Llama-2-7b-hf.json")
    assert not (tmp_path / "profiles").exists()  # read from the package, nothing to cache
