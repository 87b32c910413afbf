"""A tiny random-initialised chat model built locally, so tests and the default job need no download.

``tiny_model(path=None) -> Path`` writes a Hugging Face model directory (``Qwen2ForCausalLM`` or
``LlamaForCausalLM``) with a byte-level BPE tokenizer (Qwen2's normaliser and pre-tokenizer) trained here
with the ``tokenizers`` library on the text the registered rl-llm environments produce (system prompts,
observations and baseline actions), and a ChatML chat template (``<|im_start|>role\\n...<|im_end|>\\n``). ``<|im_end|>`` is the eos token,
``<|endoftext|>`` the pad token. The directory loads with ``AutoModelForCausalLM`` / ``AutoTokenizer`` and
its config is a plain Qwen2/Llama config that vLLM accepts (head dimension 32).

Building is idempotent: a directory that already holds a model built with the same settings, and with a
tokenizer trained on the same registered environments, is reused; after an environment is added or removed
it is rebuilt, so a cache never keeps a tokenizer that a fresh build would no longer produce.
``default_tiny_model_path()`` is the shared cache (``$RL_LLM_CACHE`` or ``~/.cache/rl-llm``, then
``tiny-qwen2``); the trainer and the tests reuse it. Concurrent builders are safe: each builds in a
private temporary directory and the first to rename it into place wins.
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

# Bump when the build recipe changes, so cached models built by an older recipe are rebuilt.
BUILD_VERSION = 3
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
# Text every chat-formatted corpus needs beyond what the environments say.
EXTRA_CORPUS = (
    "Incorrect. Please think again.",
    "Your answer is incorrect. Try an alternative.",
    "<answer>42</answer> <think>Let me think step by step.</think>",
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
    build_version: int = BUILD_VERSION


def default_tiny_model_path(architecture: str = "qwen2") -> Path:
    """Where ``tiny_model()`` builds by default: ``<cache>/tiny-<architecture>``."""
    return cache_dir() / f"tiny-{architecture}"


def resolve_model(model: str | Path) -> str | Path:
    """``"tiny"`` means the tiny model (its cached directory, built on first use); anything else is returned as is."""
    return tiny_model() if str(model) == "tiny" else model


def tiny_model(path: str | Path | None = None, **settings: int | str) -> Path:
    """Build (or reuse) a tiny random chat model at ``path`` and return the directory.

    ``settings`` override fields of ``TinyModelSpec`` (``architecture="llama"``, ``hidden_size=256``, ...).
    """
    spec = TinyModelSpec(**settings)  # type: ignore[arg-type]
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
    """What a built directory records: its settings and the environments whose text trained its tokenizer."""
    from rl_llm.envs.registration import env_ids

    return {**asdict(spec), "corpus_envs": env_ids()}


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
    import torch
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
    torch.manual_seed(spec.seed)
    if spec.architecture == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common, max_window_layers=spec.num_layers))
    else:
        model = LlamaForCausalLM(LlamaConfig(**common))
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


def environment_corpus(episodes_per_agent: int = 3, chars_per_env: int = 40_000) -> Iterator[str]:
    """System prompts, observations and actions of every registered env, played by its baselines.

    Each env contributes at most ``chars_per_env`` characters, so long-horizon envs do not crowd out the
    others' vocabulary. Envs without a baseline are stepped with a few generic actions. An env that cannot
    be built here (a missing optional dependency) is skipped with a log line: the tokenizer still covers
    every byte.
    """
    import gymnasium as gym

    import rl_llm  # noqa: F401  (registers the environments)
    from rl_llm.agents.baselines import baselines_for, make_baseline
    from rl_llm.agents.evaluate import run_episodes
    from rl_llm.envs.registration import env_ids

    yield from EXTRA_CORPUS
    for env_id in env_ids():
        texts: list[str] = []
        try:
            names = baselines_for(env_id)
            for name in names:
                records = run_episodes(
                    lambda env_id=env_id: gym.make(env_id),
                    make_baseline(name, env_id, seed=0),
                    episodes=episodes_per_agent,
                    keep_transcripts=True,
                )
                texts += (record.transcript or "" for record in records)
            if not names:
                texts += _generic_episode_text(gym.make(env_id))
        except Exception as error:  # corpus gathering must not fail on one env's optional needs
            logger.warning("tiny model corpus: skipping %s (%s: %s)", env_id, type(error).__name__, error)
        budget = chars_per_env
        for text in texts:
            yield text[:budget]
            budget -= len(text)
            if budget <= 0:
                break


def _generic_episode_text(env) -> Iterator[str]:  # env: gym.Env
    actions = ("<answer>42</answer>", "<think>I should look first.</think>", "I am not sure.")
    try:
        observation, info = env.reset(seed=0)
        yield info.get("system_prompt", "")
        yield observation
        for turn in range(min(8, getattr(env.unwrapped, "max_turns", 8))):
            action = actions[turn % len(actions)]
            observation, _, terminated, truncated, _ = env.step(action)
            yield action
            yield observation
            if terminated or truncated:
                break
    finally:
        env.close()
