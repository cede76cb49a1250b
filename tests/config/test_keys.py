"""What DeepSpeed reads from a ds_config: the key sets come from its models, every knob names a real key, and a
config's own numbers are what gets sized."""

from __future__ import annotations

from launcher.config import dsconfig
from launcher.config.keys import estimate_config, known_keys


def test_key_sets_come_from_deepspeed_and_are_not_trivial():
    keys = known_keys()
    zero = keys["zero_optimization"]
    assert len(zero) > 40
    # field names and aliases, deprecated ones included
    assert {"stage3_prefetch_bucket_size", "prefetch_bucket_size", "cpu_offload", "sub_group_size"} <= zero
    assert {"device", "nvme_path", "buffer_count", "buffer_size", "max_in_cpu", "pin_memory"} == set(
        keys["zero_optimization.offload_param"]
    )
    assert {"ratio", "pipeline_read", "fast_init"} <= keys["zero_optimization.offload_optimizer"]
    assert keys["aio"] == {
        "block_size",
        "queue_depth",
        "intra_op_parallelism",
        "single_submit",
        "overlap_events",
        "use_gds",
    }
    assert "check_grad_overflow" in keys["bf16"] and "loss_scale" in keys["fp16"]
    assert keys["optimizer"] == {"type", "params", "legacy_fusion"} and keys["scheduler"] == {"type", "params"}
    assert "enabled" in keys["tensorboard"]  # nested model of the monitor config
    top = keys[""]
    assert len(top) > 40
    assert {
        "train_batch_size",
        "zero_optimization",
        "bf16",
        "aio",
        "optimizer",
        "steps_per_print",
        "tensorboard",
    } <= top
    assert not {"nebula", "amp", "params", "type", "enabled"} & top  # removed, or sub-keys read from sections


def test_every_knob_maps_to_a_known_key():
    for key in dsconfig.KNOB_TO_DS_KEY.values():
        section, _, leaf = key.rpartition(".")
        for path in [section.replace("*", name) for name in ("optimizer", "param")] if "*" in section else [section]:
            assert leaf in known_keys()[path], key


def test_bigger_micro_batch_in_the_config_is_what_gets_sized(good, plan7b):
    _, planned = estimate_config(good, plan7b, 1)
    good.update(train_micro_batch_size_per_gpu=64, train_batch_size=64)
    _, bigger = estimate_config(good, plan7b, 1)
    assert bigger.gpu_terms["activations"] == 64 * planned.gpu_terms["activations"]
