"""Fine-tuning data as people have it, trained for real on the CPU accelerator: chat records rendered with the
tokenizer's chat template and instruction records, each with the prompts masked and a held-out loss; and a
tiny T5 trained on source/target pairs. The proof that masked tokens carry no loss through a real model is
tests/data/test_formats.py (test_masked_tokens_carry_no_loss_in_the_model); here the runs report what they
trained on and the held-out loss reaches metrics.jsonl, run.json and the report's PNG."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from launcher.views.run_chart import load_run, render_run
from tests.e2e.conftest import DEMO_TEXT, read_metrics, run_launch

pytestmark = pytest.mark.e2e

# A chat template in the Zephyr style (each turn "<|role|>\n content </s>\n"), written into the tiny model's
# tokenizer_config.json as chat models ship one.
TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def sentences(count: int) -> list[tuple[str, str]]:
    """(first half, second half) of the demo corpus's lines: a prompt and the response to learn."""
    lines = [json.loads(line)["text"] for line in DEMO_TEXT.read_text().splitlines()][:count]
    return [(" ".join(w[: len(w) // 2]), " ".join(w[len(w) // 2 :])) for w in (line.split() for line in lines)]


@pytest.fixture(scope="module")
def chat_model(tiny_model, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("chat-model")
    shutil.copytree(tiny_model, folder, dirs_exist_ok=True)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TEMPLATE}))
    return folder


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


ARGS = ("--steps", "4", "--seq-len", "64", "--micro-batch", "2", "--lr", "5e-3", "--warmup-steps", "1")


def test_chat_data_trains_on_the_assistant_turns_with_a_held_out_loss(chat_model, tmp_path):
    pairs = sentences(400)
    data = write_jsonl(
        tmp_path / "chat.jsonl",
        [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]} for q, a in pairs],
    )
    out = tmp_path / "run"
    proc = run_launch(chat_model, data, out, *ARGS, "--eval-fraction", "0.1", "--eval-every", "2")
    summary = json.loads((out / "run.json").read_text())
    assert summary["data"]["format"] == "chat" and summary["data"]["packing"] == "documents"
    tokens = summary["tokens"]
    read = 4 * 2 * 64 * summary["world_size"]  # steps x micro-batch x seq-len x ranks: packed rows hold no padding
    assert 0 < tokens["trained"] < tokens["trained"] + tokens["masked"] == read
    assert tokens["masked"] > 0.2 * (tokens["trained"] + tokens["masked"])  # the user turns and the role headers
    evals = [(m["step"], m["eval_loss"]) for m in read_metrics(out) if "eval_loss" in m]
    assert [step for step, _ in evals] == [2, 4] and summary["eval_loss"] == evals[-1][1] > 0
    assert summary["data"]["eval_rows"] > 0 and "eval loss: " in proc.stdout and "tokens: " in proc.stdout
    assert load_run(out).evals == tuple(evals)  # what the report draws
    assert render_run(out, tmp_path / "report.png").stat().st_size > 10_000


def test_instruction_data_masks_the_prompt_and_evaluates_on_its_own_file(chat_model, tmp_path):
    pairs = sentences(300)
    records = [{"instruction": q, "input": "", "output": a} for q, a in pairs]
    data = write_jsonl(tmp_path / "train.jsonl", records[:250])
    held = write_jsonl(tmp_path / "eval.jsonl", records[250:])
    out = tmp_path / "run"
    run_launch(chat_model, data, out, *ARGS, "--eval-data", str(held), "--steps", "2")
    summary = json.loads((out / "run.json").read_text())
    assert summary["data"]["format"] == "instruction" and summary["tokens"]["masked"] > 0
    assert [m.get("eval_loss") is not None for m in read_metrics(out)] == [False, True]  # at the end
    with_prompt = tmp_path / "with-prompt"
    run_launch(chat_model, data, with_prompt, *ARGS, "--steps", "2", "--train-on-prompt")
    everything = json.loads((with_prompt / "run.json").read_text())["tokens"]
    assert everything["trained"] > summary["tokens"]["trained"]  # the prompts count now


@pytest.fixture(scope="module")
def tiny_t5(tmp_path_factory) -> Path:
    """A two-layer T5 config (no weights) with a word-level tokenizer that ends each sequence with </s>, as T5's
    own does."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast, T5Config

    folder = tmp_path_factory.mktemp("tiny-t5")
    texts = [q + " " + a for q, a in sentences(1000)]
    backend = Tokenizer(models.WordLevel(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.train_from_iterator(texts, trainers.WordLevelTrainer(special_tokens=["<pad>", "</s>", "<unk>"]))
    backend.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")
    fast.save_pretrained(folder)
    T5Config(
        vocab_size=len(fast),
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_heads=4,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    ).save_pretrained(folder)
    return folder


def test_a_t5_trains_on_source_target_pairs(tiny_t5, tmp_path):
    pairs = sentences(300)
    data = write_jsonl(tmp_path / "pairs.jsonl", [{"source": q, "target": a} for q, a in pairs])
    out = tmp_path / "run"
    proc = run_launch(tiny_t5, data, out, *ARGS, "--eval-fraction", "0.05", "--steps", "3")
    summary = json.loads((out / "run.json").read_text())
    assert summary["model_class"] == "AutoModelForSeq2SeqLM" and summary["data"]["packing"] == "seq2seq"
    assert summary["tokens"]["trained"] > 0 and summary["eval_loss"] > 0
    assert "AutoModelForSeq2SeqLM.from_pretrained" in proc.stdout
    from transformers import AutoModelForSeq2SeqLM

    model = AutoModelForSeq2SeqLM.from_pretrained(out / "final")
    assert type(model).__name__ == "T5ForConditionalGeneration"
