"""The data tests' tokenizer: a fresh word-level one per test (it records what it was asked to encode)."""

from __future__ import annotations

import pytest

from tests.data.corpus import make_tokenizer


@pytest.fixture
def tokenizer():
    return make_tokenizer()
