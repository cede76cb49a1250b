"""'did you mean' hints: `nearest()` names a close spelling (a typo or two, another separator or case, a missing
or extra trailing word) and nothing else; then the message lists the valid keys."""

from __future__ import annotations

from launcher.config.keys import known_keys
from launcher.errors import nearest, unknown_key_message

TOP = sorted(known_keys()[""])
ZERO = sorted(known_keys()["zero_optimization"])


TABLE = [  # (word, the keys it is checked against, the hint or None)
    ("zero_optimisation", TOP, "zero_optimization"),  # one letter
    ("fp_16", TOP, "fp16"),  # separator
    ("Zero-Optimization", TOP, "zero_optimization"),  # case and separator
    ("train_batch", TOP, "train_batch_size"),  # missing trailing word
    ("gradient_acumulation_steps", TOP, "gradient_accumulation_steps"),  # missing letter
    ("gradient_accumulation_stpes", TOP, "gradient_accumulation_steps"),  # swapped letters
    ("aoi", TOP, "aio"),  # swapped letters in a short key
    ("train_batch_size", TOP, "train_batch_size"),  # a valid key is its own nearest
    ("offload_optimiser", ZERO, "offload_optimizer"),
    ("stage3_prefetch_bucket", ZERO, "stage3_prefetch_bucket_size"),
    ("reduce_bucket_sizes", ZERO, "reduce_bucket_size"),  # extra letter
    ("seq_length", ["seq_len", "model", "host"], "seq_len"),  # extra trailing word
    ("tiny-dmeo", ["tiny-demo", "llama2-7b-1x24g"], "tiny-demo"),
    ("1x-a100-8g", ["1x-a100-40g", "1x-a100-80g"], "1x-a100-80g"),
    # nothing close: no hint (the caller lists the valid keys)
    ("pad", TOP, None),  # difflib's ratio said 'wandb'
    ("foo", TOP, None),
    ("xyz", TOP, None),
    ("lr", TOP, None),
    ("zero", TOP, None),  # a bare stem
    ("offload", ZERO, None),  # begins offload_optimizer and offload_param: which?
    ("", TOP, None),
    ("__", TOP, None),
    ("x" * 10_000, TOP, None),
]


def test_nearest_names_only_a_close_spelling():
    got = {word[:20]: nearest(word, choices) for word, choices, _ in TABLE}
    assert got == {word[:20]: hint for word, _, hint in TABLE}


def test_the_message_lists_the_valid_keys_when_nothing_is_close():
    assert unknown_key_message("pad", ["wandb", "fp16"], "the top level") == (
        "unknown key 'pad' in the top level; valid keys: fp16, wandb"
    )
    assert unknown_key_message("fp_16", ["wandb", "fp16"], "the top level") == (
        "unknown key 'fp_16' in the top level; did you mean 'fp16'?"
    )
