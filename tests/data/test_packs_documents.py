"""blocks.packs_documents reads transformers' modeling source instead of importing it (torch with it): the same
answer as importing the class, in milliseconds."""

from __future__ import annotations

import subprocess
import sys

import pytest

from launcher.data.blocks import modeling_source_packs, packs_documents, packs_documents_imported

# the bundled profiles' families and a few without create_causal_mask or position_ids (all agreed when written:
# 163 of transformers 5.24's causal LM types readable from source, 33 left to the import)
TYPES = ["llama", "mistral", "qwen2", "qwen3", "gemma", "phi", "gpt2", "gpt_neox", "falcon", "opt", "mixtral", "bloom"]


@pytest.mark.parametrize("model_type", TYPES)
def test_the_source_says_what_importing_the_class_says(model_type):
    imported = packs_documents_imported(model_type)
    assert modeling_source_packs(model_type) in (None, imported)  # None: no one *ForCausalLM class (GPT-2's LMHead)
    assert packs_documents(model_type) == imported


def test_an_unknown_or_remote_model_is_not_known_to_pack():
    assert modeling_source_packs("no_such_model") is None
    assert packs_documents("no_such_model") is False
    assert packs_documents("llama", trust_remote_code=True) is False


def test_deciding_the_layout_imports_no_torch():
    code = (
        "import sys; from launcher.data.blocks import packs_documents as p; print(p('llama'), 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "False"]
