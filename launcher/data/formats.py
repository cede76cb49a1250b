"""What a record means for training: the formats a data set can be in, and each record as the pieces a model
reads, each marked trained (its tokens carry loss) or not (blocks.py tokenizes and packs them).

    detect_format(fields, text_field, pinned)    the data set's format, from the fields inspect_data saw
    Renderer(fmt, tokenizer, ...).render(...)    a record -> Example, or None when it has nothing to train on

Formats, recognized by their fields in this order (the first the data has wins; --data-format pins one; data
with input_ids is read as text, since it was tokenized already):

    chat         messages                        the tokenizer's chat template; loss on the assistant turns
    instruction  instruction, output (+ input)   the chat template when the tokenizer has one, else Alpaca's
                                                 prompt; loss on the output
    prompt       prompt, completion              TRL's prompt-completion format; loss on the completion
    pairs        source, target (or input, output)  the source is the prompt; loss on the target
    text         --text-field (default text)     loss on every token; a record's input_ids, when it has
                 or input_ids                    them, are used as they are instead of its text

A sequence-to-sequence model (T5, BART) reads the prompt side through its encoder and learns the response side
through its decoder: instruction, prompt and pairs data. --train-on-prompt puts loss on the prompts too (causal
models only; an encoder's input carries no loss).
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path

from launcher.errors import UserInputError

INPUT_IDS = "input_ids"
FORMAT_FIELDS = {  # format -> the fields that name it (all must be there), in detection order
    "chat": ("messages",),
    "instruction": ("instruction", "output"),
    "prompt": ("prompt", "completion"),
    "pairs": ("source", "target"),
}
PAIR_ALIASES = (("source", "target"), ("input", "output"))  # the pairs format's field names, either spelling
FORMATS = (*FORMAT_FIELDS, "text")
SEQ2SEQ_FORMATS = ("instruction", "prompt", "pairs")
# Stanford Alpaca's prompts (github.com/tatsu-lab/stanford_alpaca, train.py PROMPT_DICT): the instruction format
# without a chat template, as Alpaca and the projects that copied it trained it.
ALPACA_WITH_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
)
ALPACA = (
    "Below is an instruction that describes a task. Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Response:\n"
)


def _has(fields: tuple[str, ...], fmt: str, text_field: str) -> bool:
    if fmt == "text":
        return text_field in fields or INPUT_IDS in fields
    if fmt == "pairs":
        return any(all(f in fields for f in pair) for pair in PAIR_ALIASES)
    return all(f in fields for f in FORMAT_FIELDS[fmt])


def detect_format(fields: tuple[str, ...], text_field: str, pinned: str = "auto", where: str = "") -> str:
    """The data set's format: `pinned` (--data-format) when its fields are there, else the first format in
    FORMATS whose fields are. One line naming the fields seen and the formats known when none is."""
    if pinned != "auto":
        if not _has(fields, pinned, text_field):
            needs = " and ".join(f"'{name}'" for name in FORMAT_FIELDS.get(pinned, (text_field,)))
            raise UserInputError(
                f"no {needs} field in {where} for {pinned} data; its fields are {_listed(fields)}"
                + ("; pass --text-field with the one holding the text" if pinned == "text" else "")
            )
        return pinned
    if INPUT_IDS in fields:
        return "text"
    for fmt in FORMATS:
        if _has(fields, fmt, text_field):
            return fmt
    raise UserInputError(
        f"nothing to train on in {where}: no 'messages', 'instruction'+'output', 'prompt'+'completion', "
        f"'source'+'target', '{text_field}' or '{INPUT_IDS}' field; its fields are {_listed(fields)}; pass "
        "--text-field with the one holding the text"
    )


def columns(fmt: str, text_field: str) -> tuple[str, ...]:
    """The fields a reader of `fmt` data reads (columnar formats read only these)."""
    if fmt == "text":
        return (text_field, INPUT_IDS)
    if fmt == "pairs":
        return tuple(f for pair in PAIR_ALIASES for f in pair)
    return (*FORMAT_FIELDS[fmt], "input") if fmt == "instruction" else FORMAT_FIELDS[fmt]


def _listed(fields: tuple[str, ...]) -> str:
    return ", ".join(name if name.isprintable() else repr(name) for name in fields) or "none"


@dataclass(frozen=True)
class Example:
    """One record as the model reads it. A causal LM reads `pieces` in order: (text, or token ids, and whether
    its tokens carry loss); `eos_trained` says whether the EOS that ends it carries loss (the model learns to
    stop) or only separates it from the next. A sequence-to-sequence model reads `source` and learns `target`."""

    pieces: tuple[tuple[str | list[int], bool], ...] = ()
    eos_trained: bool = True
    source: str | None = None
    target: str | None = None


def check_seq2seq_format(fmt: str) -> None:
    """An encoder-decoder learns a response to a prompt: only the formats that have both."""
    if fmt not in SEQ2SEQ_FORMATS:
        raise UserInputError(
            f"a sequence-to-sequence model trains on prompt/response pairs ('source'+'target', 'input'+'output', "
            f"'instruction'+'output' or 'prompt'+'completion'), not {fmt} data"
        )


def read_chat_template(path: str) -> str:
    """--chat-template FILE: a Jinja template, as tokenizer_config.json's chat_template holds one."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise UserInputError(f"--chat-template {path}: {why}; pass a Jinja template file") from None
    if "{{" not in text and "{%" not in text:
        raise UserInputError(f"--chat-template {path} holds no Jinja ({{{{ ... }}}} or {{% ... %}}); pass a template")
    return text


class Renderer:
    """Records of one format -> Examples, with the tokenizer's chat template where the format uses one."""

    def __init__(self, fmt: str, tokenizer, *, text_field: str, train_on_prompt: bool, seq2seq: bool):
        if seq2seq:
            check_seq2seq_format(fmt)
        self.fmt, self.tokenizer, self.text_field = fmt, tokenizer, text_field
        self.train_on_prompt, self.seq2seq = train_on_prompt, seq2seq
        self.chat = bool(getattr(tokenizer, "chat_template", None)) and not seq2seq

    def render(self, where: str, record: dict) -> Example | None:
        if self.fmt == "chat":  # a record without messages has nothing to train on, as a text record without text
            if record.get("messages") is None:
                return None
            return self._chat(where, _messages(where, record["messages"], "messages"))
        if self.fmt == "instruction":
            instruction, context = _text(where, record, "instruction"), _text(where, record, "input", optional=True)
            return self._prompted(where, instruction, context, _text(where, record, "output"))
        if self.fmt == "prompt":
            prompt, completion = record.get("prompt"), record.get("completion")
            if isinstance(prompt, list) or isinstance(completion, list):  # TRL's conversational prompt-completion
                if self.seq2seq:
                    raise UserInputError(f"{where}: a sequence-to-sequence model trains on text prompts, not messages")
                head = _messages(where, prompt, "prompt")
                return self._split_chat(where, head, head + _messages(where, completion, "completion"))
            return self._pair(where, _text(where, record, "prompt"), _text(where, record, "completion"))
        if self.fmt == "pairs":
            source, target = next(pair for pair in PAIR_ALIASES if pair[0] in record or pair[1] in record)
            return self._pair(where, _text(where, record, source), _text(where, record, target))
        raise ValueError(f"Renderer has no rule for {self.fmt}")  # text is read by blocks.py

    def _pair(self, where: str, prompt: str | None, response: str | None) -> Example | None:
        if not response:
            return None
        if self.seq2seq:
            return Example(source=prompt or "", target=response)
        return Example(((prompt or "", self.train_on_prompt), (response, True)))

    def _prompted(self, where: str, instruction, context, output) -> Example | None:
        if not output:
            return None
        if self.seq2seq:
            return Example(source="\n\n".join(t for t in (instruction, context) if t), target=output)
        if self.chat:  # as LLaMA-Factory renders Alpaca data for a chat model: one user turn, one assistant turn
            user = "\n\n".join(t for t in (instruction, context) if t)
            return self._chat(where, [{"role": "user", "content": user}, {"role": "assistant", "content": output}])
        template = ALPACA_WITH_INPUT if context else ALPACA
        prompt = template.format(instruction=instruction or "", input=context)
        return Example(((prompt, self.train_on_prompt), (output, True)))

    # -------------------------------------------------------------------------------------- chat templates

    def _template(self, where: str, messages: list[dict], generation: bool) -> str:
        if not self.chat:
            name = getattr(self.tokenizer, "name_or_path", "") or type(self.tokenizer).__name__
            raise UserInputError(
                f"the tokenizer from {name} has no chat template to render 'messages' with; pass --chat-template "
                "FILE (a Jinja template, as tokenizer_config.json's chat_template)"
            )
        try:
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation)
        except Exception as exc:  # noqa: BLE001 - jinja's TemplateError and what templates raise on purpose
            detail = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
            raise UserInputError(f"{where}: the chat template refused these messages ({detail})") from None

    def _chat(self, where: str, messages: list[dict]) -> Example | None:
        """Loss on each assistant turn: the text an assistant message adds to the rendered conversation, found by
        rendering the conversation up to it with the generation prompt, then with it. A template that renders an
        earlier turn differently once the conversation goes on (one that drops earlier turns' reasoning, say)
        leaves only the last assistant turn to tell apart: then only that one carries loss."""
        turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        if not turns:
            return None
        pieces: list[tuple[str, bool]] = []
        done = ""
        for i in turns:
            prompt = self._template(where, messages[:i], True)
            full = self._template(where, messages[: i + 1], False)
            if not (prompt.startswith(done) and full.startswith(prompt)):
                return self._split_chat(where, messages[: turns[-1]], messages)
            pieces += [(prompt[len(done) :], self.train_on_prompt), (full[len(prompt) :], True)]
            done = full
        rest = self._template(where, messages, False)
        if rest.startswith(done) and rest != done:
            pieces.append((rest[len(done) :], self.train_on_prompt))
        return Example(tuple(p for p in pieces if p[0]), eos_trained=False)

    def _split_chat(self, where: str, head: list[dict], messages: list[dict]) -> Example | None:
        """Loss on what `messages` adds after `head` (rendered with the generation prompt)."""
        prompt = self._template(where, head, True) if head else ""
        full = self._template(where, messages, False)
        if not full.startswith(prompt):
            raise UserInputError(
                f"{where}: the chat template renders the prompt differently once the response follows, so the "
                "response's tokens cannot be told apart; pass --chat-template FILE with a template that does not"
            )
        pieces = ((prompt, self.train_on_prompt), (full[len(prompt) :], True))
        return Example(tuple(p for p in pieces if p[0]), eos_trained=False) if full != prompt else None


def _text(where: str, record: dict, name: str, optional: bool = False) -> str | None:
    value = record.get(name)
    if value is None or isinstance(value, str):
        return value
    if optional and value == []:
        return None
    raise UserInputError(f"{where}: '{name}' holds a {type(value).__name__}, not text")


def _messages(where: str, value, name: str) -> list[dict]:
    """A list of {"role": str, "content": str} (other keys kept: tool calls, names)."""
    if isinstance(value, str):  # a csv cell or a column saved as JSON text
        with contextlib.suppress(ValueError):
            value = json.loads(value)
    if not isinstance(value, list) or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str | type(None))
        for m in value
    ):
        raise UserInputError(
            f'{where}: \'{name}\' is not a list of {{"role": ..., "content": ...}} messages; fix the record'
        )
    return value
