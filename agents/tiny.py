"""A tiny random-initialised chat model built locally from a pinned recipe, so tests and the default job need no download.

``tiny_model(path=None) -> Path`` writes a Hugging Face model directory (``Qwen2ForCausalLM`` or
``LlamaForCausalLM``) with a byte-level BPE tokenizer (Qwen2's normaliser and pre-tokenizer) and a ChatML chat
template (``<|im_start|>role\\n...<|im_end|>\\n``). ``<|im_end|>`` is the eos token, ``<|endoftext|>`` the pad
token. The directory loads with ``AutoModelForCausalLM`` / ``AutoTokenizer`` and its config is a plain
Qwen2/Llama config that vLLM accepts (head dimension 32).

The recipe is versioned (``RECIPE_VERSION``): the tokenizer is trained on a corpus shipped in the package
(``data/tiny_corpus_v<RECIPE_VERSION>.jsonl``: system prompts, observations and baseline actions of the
environments as they were when the version was cut), and the initial weights are drawn parameter by parameter
(in name order) from a seeded ``torch.Generator``, not by the model classes' own initialisers. So the model
depends only on the recipe version and the ``TinyModelSpec`` settings: registering an environment, a missing
optional dependency or a new transformers init scheme does not change it. A change to any of that is a new
recipe version (a new corpus file), and the trainer records the version in its ``summary.json``.

Building is idempotent: a directory that already holds a model built with the same settings and recipe is
reused, otherwise rebuilt. ``default_tiny_model_path()`` is the shared cache (``$RL_LLM_CACHE`` or
``~/.cache/rl-llm``, then ``tiny-qwen2-r<RECIPE_VERSION>``); the trainer and the tests reuse it. Concurrent
builders are safe: each builds in a private temporary directory and the first to rename it into place wins.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rl_llm.paths import cache_dir

logger = logging.getLogger(__name__)

# The tiny model recipe: bump it (and ship data/tiny_corpus_v<N>.jsonl) whenever the corpus, the tokenizer
# training or the weight initialisation changes; cached models of another version are never reused.
RECIPE_VERSION = 1
CORPUS_FILE = Path(__file__).parent / "data" / f"tiny_corpus_v{RECIPE_VERSION}.jsonl"
INIT_STD = 0.02  # Qwen2's initializer_range: normal(0, 0.02) matrices and embeddings, zero biases, unit norms
MARKER_FILE = "rl_llm_tiny_model.json"
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# Qwen2's pre-tokenizer split (as in transformers' Qwen2Tokenizer).
QWEN2_PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@dataclass(frozen=True)
class TinyModelSpec:
    """The settings a tiny model is built from; stored next to it to decide whether a cache is reusable."""

    architecture: str = "qwen2"
    vocab_size: int = 2048
    hidden_size: int = 128
    intermediate_size: int = 384
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    max_position_embeddings: int = 8192
    seed: int = 0
    recipe_version: int = RECIPE_VERSION


def default_tiny_model_path(architecture: str = "qwen2") -> Path:
    """Where ``tiny_model()`` builds by default: ``<cache>/tiny-<architecture>-r<RECIPE_VERSION>``."""
    return cache_dir() / f"tiny-{architecture}-r{RECIPE_VERSION}"


def resolve_model(model: str | Path) -> str | Path:
    """``"tiny"`` means the tiny model (its cached directory, built on first use); anything else is returned as is."""
    return tiny_model() if str(model) == "tiny" else model


def tiny_model(path: str | Path | None = None, **settings: int | str) -> Path:
    """Build (or reuse) a tiny random chat model at ``path`` and return the directory.

    ``settings`` override fields of ``TinyModelSpec`` (``architecture="llama"``, ``hidden_size=256``, ...).
    """
    spec = TinyModelSpec(**settings)  # type: ignore[arg-type]
    if spec.recipe_version != RECIPE_VERSION:
        raise ValueError(f"this rl-llm builds tiny model recipe {RECIPE_VERSION}, not {spec.recipe_version}")
    if spec.architecture not in ("qwen2", "llama"):
        raise ValueError(f"architecture must be 'qwen2' or 'llama', got {spec.architecture!r}")
    if spec.hidden_size % spec.num_heads or spec.num_heads % spec.num_kv_heads:
        raise ValueError("hidden_size must divide by num_heads, and num_heads by num_kv_heads")
    target = Path(path) if path is not None else default_tiny_model_path(spec.architecture)
    if _is_built(target, spec):
        return target
    if target.exists() and any(target.iterdir()):
        if not (target / MARKER_FILE).exists():
            raise FileExistsError(f"{target} exists and is not a tiny rl-llm model; choose another path")
        logger.info("rebuilding the tiny model at %s (its settings differ)", target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        _build(staging, spec)
        _move_into_place(staging, target, spec)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _marker(spec: TinyModelSpec) -> dict[str, Any]:
    """What a built directory records: its settings, recipe version included."""
    return asdict(spec)


def recipe_of(path: str | Path) -> dict[str, Any] | None:
    """The recipe a model directory was built from (``TinyModelSpec`` fields), or None if it is no tiny model."""
    try:
        record = json.loads((Path(path) / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _is_built(path: Path, spec: TinyModelSpec) -> bool:
    try:
        return json.loads((path / MARKER_FILE).read_text()) == _marker(spec)
    except (OSError, ValueError):
        return False


def _move_into_place(staging: Path, target: Path, spec: TinyModelSpec) -> None:
    if target.exists():
        if _is_built(target, spec):  # another process finished first
            return
        stale = target.with_name(f".{target.name}-stale-{os.getpid()}")
        target.rename(stale)
        shutil.rmtree(stale, ignore_errors=True)
    try:
        staging.rename(target)
    except OSError:
        if not _is_built(target, spec):
            raise


def _build(directory: Path, spec: TinyModelSpec) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    tokenizer = build_tokenizer(spec.vocab_size)
    tokenizer.save_pretrained(directory)
    eos, pad = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos,
        pad_token_id=pad,
        dtype="float32",
    )
    if spec.architecture == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common, max_window_layers=spec.num_layers))
    else:
        model = LlamaForCausalLM(LlamaConfig(**common))
    _initialise(model, spec.seed)
    model.generation_config.eos_token_id = [eos, pad]
    model.generation_config.pad_token_id = pad
    model.generation_config.bos_token_id = None
    model.save_pretrained(directory)
    (directory / MARKER_FILE).write_text(json.dumps(_marker(spec), indent=2))


def build_tokenizer(vocab_size: int):  # -> PreTrainedTokenizerFast
    """A byte-level BPE tokenizer trained on environment text, with the ChatML template."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    # Qwen2's pipeline, which transformers 5 imposes on every qwen2 model directory whatever tokenizer.json
    # says: trained as it is used, and the same ids under every transformers version. decode(encode(text))
    # gives back the text exactly when it is NFC-normalised (and its NFC form otherwise).
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])  # fmt: skip
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(environment_corpus(), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
        padding_side="left",
        model_max_length=8192,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def environment_corpus() -> Iterator[str]:
    """The recipe's pinned tokenizer corpus: one text per line of the shipped JSONL file."""
    with CORPUS_FILE.open(encoding="utf-8") as lines:
        for line in lines:
            if line.strip():
                yield json.loads(line)


def _initialise(model: Any, seed: int) -> None:
    """Draw every parameter from one seeded generator, in name order (tied weights once).

    The model classes' own initialisers change between transformers versions; this does not.
    """
    import torch

    generator = torch.Generator().manual_seed(seed)
    seen: set[int] = set()
    with torch.no_grad():
        for name, parameter in sorted(model.named_parameters(), key=lambda item: item[0]):
            if id(parameter) in seen:
                continue
            seen.add(id(parameter))
            if name.endswith("norm.weight"):
                parameter.fill_(1.0)
            elif name.endswith(".bias"):
                parameter.zero_()
            else:
                values = torch.randn(parameter.shape, generator=generator, dtype=torch.float32) * INIT_STD
                parameter.copy_(values)
