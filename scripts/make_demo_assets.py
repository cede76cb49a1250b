"""Regenerate the demo assets in launcher/demo/ deterministically (no network needed):

    data/train.jsonl   ~200 KB of seeded, grammar-generated English on the project's theme ({"text": ...} per line)
    tiny-llama/        a ~1M-parameter LlamaForCausalLM config.json (no weights) and a byte-level BPE tokenizer
                       trained on data/train.jsonl (tokenizer.json, tokenizer_config.json)

The text is structured (memory arithmetic that is always right, ZeRO facts, PCIe timings, training logs, sums
and products) but varied by a seeded RNG, so a tiny model's loss falls visibly in ~30 steps without it simply
memorising the file.

    .venv/bin/python scripts/make_demo_assets.py            # rewrite launcher/demo/
    .venv/bin/python scripts/make_demo_assets.py --check    # regenerate elsewhere, fail if launcher/demo differs
"""

from __future__ import annotations

import argparse
import filecmp
import json
import random
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "launcher" / "demo"
SEED = 20240611
N_DOCUMENTS = 660
VOCAB_SIZE = 1024  # byte-level BPE: 256 bytes + 4 special tokens + 764 merges
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]  # ids 0..3, Llama's order for the first three
MODEL = dict(  # ~1.07M parameters: about a second per step on 2 CPU cores at seq_len 128
    hidden_size=128,
    intermediate_size=352,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=4,
    max_position_embeddings=256,
    tie_word_embeddings=False,
    rms_norm_eps=1e-5,
)
MAX_LENGTH = 256

# ------------------------------------------------------------------------------------------------ text

MODELS = [("a tiny", 0.125), ("a small", 1.0), ("a 3B", 3.0), ("a 7B", 7.0), ("a 13B", 13.0), ("a 70B", 70.0)]
GPUS = [("an RTX 4090", 24), ("an A100", 40), ("an A100", 80), ("an H100", 80), ("an H200", 141), ("an L4", 24)]
PCIE = [(3, 16), (4, 32), (5, 64)]  # generation, GB/s for x16
OPENERS = ["Here is a fact.", "Remember this.", "A quick note.", "Consider the numbers.", "Let us count.", ""]
NOUNS = ["optimizer", "gradient", "weight", "buffer", "kernel", "batch", "layer", "checkpoint", "tensor", "rank"]
ADJECTIVES = ["large", "small", "pinned", "sharded", "quiet", "busy", "fast", "slow", "careful", "patient"]
PLACES = ["the GPU", "CPU memory", "the NVMe drive", "the PCIe bus", "the next rank", "host RAM"]
VERBS = ["moves", "waits for", "copies", "updates", "gathers", "frees", "reads", "writes"]


def fmt_gb(value: float) -> str:
    return f"{value:g}" if value == int(value) else f"{value:.1f}"


def memory_paragraph(rng: random.Random) -> str:
    name, billions = rng.choice(MODELS)
    opener = rng.choice(OPENERS)
    sentences = [
        f"{name.capitalize()} model has {fmt_gb(billions)} billion parameters.",
        f"Mixed precision Adam keeps 16 bytes per parameter, so it needs {fmt_gb(16 * billions)} GB in all.",
        f"The weights take {fmt_gb(2 * billions)} GB and the gradients take {fmt_gb(2 * billions)} GB.",
        f"The optimizer states take {fmt_gb(12 * billions)} GB, which is twelve bytes per parameter.",
    ]
    if rng.random() < 0.5:
        gpu, memory = rng.choice(GPUS)
        fits = 16 * billions <= 0.9 * memory
        verdict = "fits on" if fits else "does not fit on"
        sentences.append(f"That {verdict} {gpu} with {memory} GB of memory.")
        if not fits:
            sentences.append(f"Offload the optimizer to the CPU and the GPU keeps only {fmt_gb(4 * billions)} GB.")
    rng.shuffle(sentences[2:4])
    return " ".join(s for s in [opener, *sentences] if s)


def zero_paragraph(rng: random.Random) -> str:
    gpus = rng.choice([2, 4, 8, 16])
    billions = rng.choice([1.0, 3.0, 7.0, 13.0])
    stage = rng.choice([1, 2, 3])
    facts = {
        1: "ZeRO stage 1 partitions the optimizer states across the GPUs.",
        2: "ZeRO stage 2 partitions the optimizer states and the gradients.",
        3: "ZeRO stage 3 partitions the optimizer states, the gradients and the parameters.",
    }
    per_gpu = {1: 4 * billions + 12 * billions / gpus, 2: 2 * billions + 14 * billions / gpus, 3: 16 * billions / gpus}
    lines = [
        facts[stage],
        f"With {gpus} GPUs and {fmt_gb(billions)} billion parameters, "
        f"each GPU holds {fmt_gb(per_gpu[stage])} GB of model states at stage {stage}.",
    ]
    if rng.random() < 0.4:
        other = rng.choice([s for s in (1, 2, 3) if s != stage])
        lines.append(f"At stage {other} it would hold {fmt_gb(per_gpu[other])} GB instead.")
    if rng.random() < 0.3:
        lines.append("Stage 3 gathers each layer just before it runs and frees it right after.")
    return " ".join(lines)


def pcie_paragraph(rng: random.Random) -> str:
    generation, bandwidth = rng.choice(PCIE)
    billions = rng.choice([1.0, 3.0, 7.0, 13.0, 70.0])
    traffic = 4 * billions
    seconds = traffic / bandwidth
    return (
        f"PCIe {generation} moves about {bandwidth} GB per second. "
        f"Offloading {fmt_gb(billions)} billion parameters sends {fmt_gb(traffic)} GB over the bus each step, "
        f"gradients down and weights back up. That takes about {seconds:.2f} seconds. "
        + rng.choice(
            [
                "A bigger batch hides this cost.",
                "With a small batch the bus is the bottleneck.",
                "The GPU waits while the bus is busy.",
                "Overlap hides part of the transfer.",
            ]
        )
    )


def arithmetic_paragraph(rng: random.Random) -> str:
    lines = []
    for _ in range(rng.randint(3, 6)):
        a, b = rng.randint(0, 20), rng.randint(0, 20)
        kind = rng.random()
        if kind < 0.4:
            lines.append(f"{a} plus {b} is {a + b}.")
        elif kind < 0.7:
            lines.append(f"{a} times {b} is {a * b}.")
        elif a >= b:
            lines.append(f"{a} minus {b} is {a - b}.")
        else:
            lines.append(f"{b} minus {a} is {b - a}.")
    return " ".join(lines)


def log_paragraph(rng: random.Random) -> str:
    loss = rng.uniform(6.5, 7.5)
    lr = rng.choice([1e-4, 3e-4, 1e-3])
    start = rng.randrange(0, 200, 10)
    lines = [f"Training log with learning rate {lr:g}."]
    for step in range(start, start + 10 * rng.randint(3, 6), 10):
        loss *= rng.uniform(0.85, 0.97)
        lines.append(f"step {step}: loss {loss:.2f}")
    lines.append(rng.choice(["The loss goes down.", "Training is stable.", "The run looks healthy."]))
    return "\n".join(lines)


def story_paragraph(rng: random.Random) -> str:
    lines = []
    for _ in range(rng.randint(2, 4)):
        adjective, noun, verb, place = rng.choice(ADJECTIVES), rng.choice(NOUNS), rng.choice(VERBS), rng.choice(PLACES)
        other = rng.choice([n for n in NOUNS if n != noun])
        lines.append(f"The {adjective} {noun} {verb} the {other} in {place}.")
    return " ".join(lines)


PARAGRAPHS = [memory_paragraph, zero_paragraph, pcie_paragraph, arithmetic_paragraph, log_paragraph, story_paragraph]


def documents(seed: int = SEED, count: int = N_DOCUMENTS) -> list[str]:
    rng = random.Random(seed)
    return ["\n\n".join(rng.choice(PARAGRAPHS)(rng) for _ in range(rng.randint(1, 3))) for _ in range(count)]


# ------------------------------------------------------------------------------------------- write out


def write_data(out: Path, docs: list[str]) -> Path:
    path = out / "data" / "train.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": doc}) + "\n" for doc in docs))
    return path


def write_tokenizer(out: Path, docs: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(docs, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=MAX_LENGTH,
    )
    tokenizer.save_pretrained(out / "tiny-llama")
    # transformers 5 writes its own class name ("TokenizersBackend"), which 4.x's AutoTokenizer cannot find;
    # the 4.x name still loads on 5.x, so the assets work across the whole supported range (>= 4.46).
    config_path = out / "tiny-llama" / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return tokenizer


def write_config(out: Path, tokenizer):
    from transformers import LlamaConfig

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **MODEL,
    )
    config.architectures = ["LlamaForCausalLM"]
    config.save_pretrained(out / "tiny-llama")
    return config


def generate(out: Path) -> None:
    docs = documents()
    write_data(out, docs)
    tokenizer = write_tokenizer(out, docs)
    write_config(out, tokenizer)


def verify(out: Path) -> None:
    """Load everything the way the launcher will, and print the sizes a reviewer wants to see."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    sys.path.insert(0, str(REPO))
    from launcher.data.blocks import load_token_set
    from launcher.data.rows import Tokenization
    from launcher.data.sources import inspect_data

    model_dir = out / "tiny-llama"
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    config = AutoConfig.from_pretrained(model_dir)
    assert config.vocab_size == len(tokenizer), (config.vocab_size, len(tokenizer))
    model = AutoModelForCausalLM.from_config(config)
    params = sum(p.numel() for p in model.parameters())
    rows = load_token_set(inspect_data(str(out / "data" / "train.jsonl")), tokenizer, Tokenization(seq_len=128))
    blocks = rows.arrays["input_ids"]
    with torch.no_grad():
        loss = model(**{name: torch.as_tensor(array) for name, array in rows.inputs([0, 1]).items()}).loss
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        print(f"{path.relative_to(out)}: {path.stat().st_size:,} bytes")
    print(f"tokenizer: {len(tokenizer)} tokens, eos={tokenizer.eos_token!r} ({tokenizer.eos_token_id})")
    print(f"model: {type(model).__name__}, {params:,} parameters; {blocks.size:,} tokens = {len(blocks)} blocks of 128")
    print(f"untrained loss {loss.item():.2f} (ln vocab = {torch.log(torch.tensor(float(len(tokenizer)))).item():.2f})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEMO, help="folder to write (default: launcher/demo)")
    parser.add_argument("--check", action="store_true", help="regenerate in a temporary folder and compare")
    args = parser.parse_args()
    if args.check:
        with tempfile.TemporaryDirectory() as tmp:
            generate(Path(tmp))
            names = sorted(str(p.relative_to(tmp)) for p in Path(tmp).rglob("*") if p.is_file())
            _, mismatch, errors = filecmp.cmpfiles(tmp, args.out, names, shallow=False)
        if mismatch or errors:
            print(f"{args.out} differs from a fresh generation: {', '.join(mismatch + errors)}", file=sys.stderr)
            return 1
        print(f"{args.out} matches a fresh generation ({len(names)} files)")
        return 0
    generate(args.out)
    verify(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
