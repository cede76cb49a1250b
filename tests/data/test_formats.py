"""Chat, instruction, prompt-completion and pair data (launcher/data/formats.py) as the rows a model trains on
(launcher/data/blocks.py): which tokens carry loss, how documents are packed or padded, the held-out rows, and
a real model's loss over them."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from launcher.data import formats
from launcher.data.blocks import cache_key, load_splits, load_token_set, packing_for, packs_documents
from launcher.data.rows import IGNORE, Tokenization, count_tokens
from launcher.data.sources import inspect_data
from launcher.errors import UserInputError
from launcher.settings import DATA_FORMATS
from tests.data.corpus import one_line_error

WORDS = ["user", "assistant", "system", "zero", "one", "two", "three", "four", "five", "six", "seven", "eight"]
WORDS += ["nine", "ten", "gpu", "cpu", "nvme", "adam"]
VOCAB = {"[UNK]": 0, "</s>": 1, "<pad>": 2, **{word: i + 3 for i, word in enumerate(WORDS)}}
EOS, PAD = VOCAB["</s>"], VOCAB["<pad>"]
# A template in the tokenizer's words: each turn is "role content", an assistant turn ends with </s>.
TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% if m['role'] == 'assistant' %}</s> {% endif %}"
    "{% endfor %}{% if add_generation_prompt %}assistant {% endif %}"
)


def tokenizer(template: str | None = TEMPLATE) -> PreTrainedTokenizerFast:
    backend = Tokenizer(models.WordLevel(vocab=VOCAB, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", eos_token="</s>", pad_token="<pad>")
    tok.chat_template = template
    return tok


def ids(text: str) -> list[int]:
    return [VOCAB[word] for word in text.split()]


def write(tmp_path, records: list[dict], name: str = "data.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return inspect_data(str(path))


def rows(source, tok, seq_len: int, packing: str, **layout):
    return load_token_set(source, tok, Tokenization(seq_len, format=source.kind, packing=packing, **layout))


def trained(token_set, row: int = 0) -> list[int]:
    """The token ids of a row that carry loss (labels other than -100, past the first position: the model
    shifts them)."""
    labels = token_set.inputs([row])["labels"][0]
    return [int(t) for t in labels[1:] if t != IGNORE]


CHAT = {
    "messages": [
        {"role": "user", "content": "zero one"},
        {"role": "assistant", "content": "two three"},
        {"role": "user", "content": "four"},
        {"role": "assistant", "content": "five six"},
    ]
}


# ------------------------------------------------------------------------------------------ formats


def test_the_format_is_told_from_the_fields_in_one_order():
    assert formats.detect_format(("messages", "text"), "text") == "chat"
    assert formats.detect_format(("instruction", "input", "output"), "text") == "instruction"
    assert formats.detect_format(("prompt", "completion"), "text") == "prompt"
    assert formats.detect_format(("input", "output"), "text") == "pairs"
    assert formats.detect_format(("source", "target", "id"), "text") == "pairs"
    assert formats.detect_format(("body",), "body") == "text"
    assert formats.detect_format(("messages", "input_ids"), "text") == "text"  # tokenized already: used as it is
    assert formats.detect_format(("messages", "text"), "text", pinned="text") == "text"
    assert DATA_FORMATS[1:] == formats.FORMATS  # --data-format offers exactly these
    message = one_line_error(formats.detect_format, ("text",), "text", "chat", "d.jsonl")
    assert message == "no 'messages' field in d.jsonl for chat data; its fields are text"


def test_chat_puts_loss_on_every_assistant_turn_and_nothing_else(tmp_path):
    token_set = rows(write(tmp_path, [CHAT]), tokenizer(), 32, "pad")
    rendered = "user zero one assistant two three </s> user four assistant five six </s>"
    assert token_set.arrays["input_ids"][0, : len(rendered.split())].tolist() == ids(rendered)
    assert trained(token_set) == ids("two three </s> five six </s>")  # the template's own </s> ends a turn
    counts = token_set.token_counts()
    assert counts == {"tokens": 13, "trained": 6, "masked": 7, "padding": 32 - 13}


def test_train_on_prompt_puts_loss_on_the_prompts_too(tmp_path):
    token_set = rows(write(tmp_path, [CHAT]), tokenizer(), 32, "pad", train_on_prompt=True)
    assert len(trained(token_set)) == 12  # every token but the first, which nothing predicts


def test_messages_need_a_chat_template_or_one_given(tmp_path):
    source = write(tmp_path, [CHAT])
    message = one_line_error(rows, source, tokenizer(template=None), 32, "pad")
    assert "has no chat template to render 'messages' with; pass --chat-template FILE" in message
    given = rows(source, tokenizer(template=None), 32, "pad", chat_template=TEMPLATE)
    assert trained(given) == ids("two three </s> five six </s>")
    (tmp_path / "t.jinja").write_text(TEMPLATE)
    assert formats.read_chat_template(str(tmp_path / "t.jinja")) == TEMPLATE
    (tmp_path / "plain.txt").write_text("no template here")
    assert "holds no Jinja" in one_line_error(formats.read_chat_template, str(tmp_path / "plain.txt"))


def test_a_template_that_rewrites_earlier_turns_trains_the_last_one(tmp_path):
    """Templates that drop earlier turns' reasoning render the conversation differently as it grows: the last
    assistant turn is still told apart, and only it carries loss."""
    forgetful = (  # an assistant turn followed by more messages loses its content
        "{% for m in messages %}{% if m['role'] == 'assistant' and not loop.last %}assistant </s> {% else %}"
        "{{ m['role'] }} {{ m['content'] }} {% if m['role'] == 'assistant' %}</s> {% endif %}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}assistant {% endif %}"
    )
    token_set = rows(write(tmp_path, [CHAT]), tokenizer(forgetful), 32, "pad")
    assert trained(token_set) == ids("five six </s>")


def test_instruction_data_uses_the_chat_template_or_alpacas_prompt(tmp_path):
    record = {"instruction": "zero one", "input": "two", "output": "three four"}
    chat = rows(write(tmp_path, [record]), tokenizer(), 32, "pad")
    assert trained(chat) == ids("three four </s>")
    assert chat.arrays["input_ids"][0, :2].tolist() == ids("user zero")  # one user turn: instruction, input
    alpaca = rows(write(tmp_path, [record]), tokenizer(template=None), 64, "pad")
    assert trained(alpaca) == ids("three four </s>")  # the output and the EOS that ends it: the model learns to stop
    prompt = formats.ALPACA_WITH_INPUT.format(instruction="zero one", input="two")
    assert int(alpaca.arrays["attention_mask"][0].sum()) == len(tokenizer()(prompt)["input_ids"]) + 3


def test_prompt_completion_data_and_its_conversational_form(tmp_path):
    plain = rows(write(tmp_path, [{"prompt": "zero one", "completion": "two"}]), tokenizer(), 16, "pad")
    assert trained(plain) == ids("two </s>")
    conversational = {
        "prompt": [{"role": "user", "content": "zero"}],
        "completion": [{"role": "assistant", "content": "one two"}],
    }
    assert trained(rows(write(tmp_path, [conversational]), tokenizer(), 16, "pad")) == ids("one two </s>")


def test_records_with_nothing_to_train_on_are_skipped_and_counted(tmp_path):
    records = [CHAT, {"messages": [{"role": "user", "content": "zero"}]}, {"messages": CHAT["messages"][:2]}]
    token_set = rows(write(tmp_path, records), tokenizer(), 32, "pad")
    assert len(token_set) == 2 and token_set.stats == {"records": 3, "skipped": 1, "truncated": 0}
    bad = write(tmp_path, [{"messages": "zero one"}], name="bad.jsonl")
    assert one_line_error(rows, bad, tokenizer(), 32, "pad") == (
        f'{bad.path}:1: \'messages\' is not a list of {{"role": ..., "content": ...}} messages; fix the record'
    )


# ------------------------------------------------------------------------------------------ layouts


def test_packed_documents_restart_their_positions_and_their_first_token_carries_no_loss(tmp_path):
    records = [{"prompt": "zero one", "completion": "two"}, {"prompt": "three", "completion": "four five"}]
    token_set = rows(write(tmp_path, records), tokenizer(), 5, "documents")
    # stream: zero one two </s> | three four five </s>, cut into rows of 5: the 3 tokens left fill no row
    assert token_set.arrays["input_ids"].tolist() == [ids("zero one two </s> three")]
    assert token_set.arrays["position_ids"].tolist() == [[0, 1, 2, 3, 0]]
    assert trained(token_set) == ids("two </s>")  # "three" starts a document (and is a prompt): no loss
    longer = rows(write(tmp_path, records * 3, name="more.jsonl"), tokenizer(), 6, "documents")
    assert longer.arrays["position_ids"][1].tolist() == [0, 1, 0, 1, 2, 3]  # a row restarts mid-document too


def test_padded_rows_hold_one_record_each_and_count_what_was_cut(tmp_path):
    records = [{"prompt": "zero", "completion": "one two"}, {"prompt": "three four five six", "completion": "seven"}]
    token_set = rows(write(tmp_path, records), tokenizer(), 4, "pad")
    assert token_set.arrays["input_ids"].tolist() == [ids("zero one two </s>")]  # the second: prompt fills the row
    assert token_set.stats == {"records": 2, "skipped": 1, "truncated": 1}
    wide = rows(write(tmp_path, records, name="w.jsonl"), tokenizer(), 8, "pad")
    assert wide.arrays["input_ids"][0].tolist() == ids("zero one two </s>") + [PAD] * 4
    assert wide.arrays["attention_mask"][0].tolist() == [True] * 4 + [False] * 4
    assert count_tokens(wide.inputs([0, 1]), seq2seq=False) == {"tokens": 10, "trained": 5, "masked": 5, "padding": 6}


def test_pairs_for_a_sequence_to_sequence_model(tmp_path):
    source = write(tmp_path, [{"source": "zero one", "target": "two"}, {"input": "three", "output": "four five"}])
    token_set = rows(source, tokenizer(), 4, "seq2seq")
    assert token_set.seq2seq and token_set.arrays["input_ids"].tolist() == [
        ids("zero one") + [PAD] * 2,
        ids("three") + [PAD] * 3,
    ]
    assert token_set.arrays["labels"].tolist() == [ids("two") + [IGNORE] * 3, ids("four five") + [IGNORE] * 2]
    assert token_set.token_counts() == {"tokens": 6, "trained": 3, "masked": 3, "padding": 10}
    chat = write(tmp_path, [CHAT], name="chat.jsonl")
    assert "trains on prompt/response pairs" in one_line_error(rows, chat, tokenizer(), 4, "seq2seq")


def test_the_layout_follows_the_model():
    assert packing_for("chat", "causal-lm", packs_documents=True) == "documents"
    assert packing_for("chat", "causal-lm", packs_documents=False) == "pad"
    assert packing_for("text", "causal-lm", packs_documents=False) == "stream"
    assert packing_for("pairs", "seq2seq-lm", packs_documents=False) == "seq2seq"
    assert packs_documents("llama") and packs_documents("gpt2")
    assert not packs_documents("llama", trust_remote_code=True) and not packs_documents("no-such-model")


def test_the_cache_key_follows_the_template_and_the_layout(tmp_path):
    source = write(tmp_path, [CHAT])
    base = cache_key(source, tokenizer(), Tokenization(8, format="chat", packing="pad"))
    assert cache_key(source, tokenizer(), Tokenization(8, format="chat", packing="documents")) != base
    assert cache_key(source, tokenizer(), Tokenization(8, format="chat", packing="pad", train_on_prompt=True)) != base
    other = TEMPLATE.replace("</s> ", "")
    assert cache_key(source, tokenizer(other), Tokenization(8, format="chat", packing="pad")) != base
    cache = tmp_path / "cache"
    first = load_token_set(source, tokenizer(), Tokenization(8, format="chat", packing="pad"), cache)
    again = load_token_set(source, tokenizer(), Tokenization(8, format="chat", packing="pad"), cache)
    assert again.digest() == first.digest() and again.stats == first.stats


# ------------------------------------------------------------------------------------------ held out


def test_held_out_rows_are_fixed_disjoint_and_spread(tmp_path):
    records = [{"text": " ".join(WORDS[3:][i % 10 : i % 10 + 3])} for i in range(200)]
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    layout = Tokenization(4)
    train, held = load_splits(str(path), layout, tokenizer(), eval_fraction=0.1)
    whole, none = load_splits(str(path), layout, tokenizer())
    assert none is None and len(train) + len(held) == len(whole) and len(held) == int(np.ceil(0.1 * len(whole)))
    train2, held2 = load_splits(str(path), layout, tokenizer(), eval_fraction=0.1)
    assert held2.digest() == held.digest() and train2.digest() == train.digest()
    rows_of = {tuple(r) for r in whole.arrays["input_ids"].tolist()}
    assert {tuple(r) for r in held.arrays["input_ids"].tolist()} <= rows_of
    other = tmp_path / "eval.jsonl"
    other.write_text(json.dumps({"text": "zero one two three four"}) + "\n")
    _, separate = load_splits(str(path), layout, tokenizer(), eval_data=str(other))
    assert separate.arrays["input_ids"].tolist() == [ids("zero one two three")]


# ------------------------------------------------------------------------------------------ a real model


def test_masked_tokens_carry_no_loss_in_the_model(tmp_path):
    """The rows' labels through a real Llama: the loss's gradient reaches the logits only at positions that
    predict a trained token; prompts and padding get exactly zero, and the loss is the mean over trained tokens."""
    short = {"messages": [{"role": "user", "content": "zero"}, {"role": "assistant", "content": "one"}]}
    token_set = rows(write(tmp_path, [CHAT, short]), tokenizer(), 16, "pad")
    config = LlamaConfig(
        vocab_size=len(VOCAB), hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2
    )
    model = LlamaForCausalLM(config)
    inputs = {name: torch.from_numpy(array) for name, array in token_set.inputs([0, 1]).items()}
    logits = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).logits
    logits.retain_grad()
    loss = model.loss_function(logits, inputs["labels"], vocab_size=config.vocab_size)
    loss.backward()
    predicts_trained = torch.zeros(inputs["labels"].shape, dtype=torch.bool)
    predicts_trained[:, :-1] = inputs["labels"][:, 1:] != IGNORE  # logits at t predict token t + 1
    grad = logits.grad.abs().sum(-1)
    assert (grad[~predicts_trained] == 0).all() and (grad[predicts_trained] > 0).all()
    assert int(predicts_trained.sum()) == count_tokens(inputs, seq2seq=False)["trained"] == 6 + 2
    targets = inputs["labels"][:, 1:][predicts_trained[:, :-1]]
    by_hand = torch.nn.functional.cross_entropy(logits[:, :-1][predicts_trained[:, :-1]], targets)
    assert loss.item() == pytest.approx(by_hand.item(), rel=1e-5)


def test_packed_documents_do_not_see_each_other_in_the_model(tmp_path):
    """With restarting position ids transformers masks attention per document: the second document's logits
    are the same packed behind the first as alone."""
    records = [{"prompt": "zero one", "completion": "two"}, {"prompt": "three", "completion": "four five"}]
    packed = rows(write(tmp_path, records), tokenizer(), 8, "documents")
    alone = rows(write(tmp_path, records[1:], name="alone.jsonl"), tokenizer(), 4, "documents")
    config = LlamaConfig(
        vocab_size=len(VOCAB), hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2
    )
    model = LlamaForCausalLM(config).eval()
    model.config.use_cache = False
    with torch.no_grad():
        both = model(**{k: torch.from_numpy(v) for k, v in packed.inputs([0]).items() if k != "labels"}).logits
        one = model(**{k: torch.from_numpy(v) for k, v in alone.inputs([0]).items() if k != "labels"}).logits
    assert torch.allclose(both[0, 4:8], one[0], atol=1e-5)


def test_a_pinned_format_and_the_user_errors_are_one_line(tmp_path):
    source = inspect_data(str(write(tmp_path, [CHAT]).path), data_format="auto")
    assert source.kind == "chat"
    with pytest.raises(UserInputError, match=r"no 'instruction' and 'output' field in .* for instruction data"):
        inspect_data(source.path, data_format="instruction")
