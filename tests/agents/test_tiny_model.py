"""The locally built tiny model: loads in transformers, vLLM-compatible config, lossless tokenizer, reused cache."""

from __future__ import annotations

import unicodedata
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from tokenizers import Tokenizer
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from rl_llm.agents.tiny import (
    MARKER_FILE,
    RECIPE_VERSION,
    TinyModelSpec,
    _is_built,
    default_tiny_model_path,
    recipe_of,
    resolve_model,
    tiny_model,
)
from rl_llm.envs import registration
from tests.conftest import hostile_text

# Recipe 1's vocabulary size and the ids of one bandit line (see test_pinned_recipe_fingerprint).
PINNED_VOCAB = 2003
PINNED_IDS = [356, 223, 19, 311, 223, 22, 16, 420, 301, 533, 307, 301, 32]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_loads_in_transformers_as_a_small_qwen2_chat_model(tiny_model_dir: Path, tokenizer) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    config = AutoConfig.from_pretrained(tiny_model_dir)
    assert config.architectures == ["Qwen2ForCausalLM"] and config.model_type == "qwen2"
    assert config.hidden_size // config.num_attention_heads >= 32, "vLLM's attention kernels need head_dim >= 32"
    assert 1_000 <= config.vocab_size <= 4_096 and config.vocab_size == len(tokenizer)
    assert sum(p.numel() for p in model.parameters()) < 2_000_000
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert config.eos_token_id == tokenizer.eos_token_id
    rendered = tokenizer.apply_chat_template(
        [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}], tokenize=False, add_generation_prompt=True
    )
    assert rendered == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    assert len(tokenizer.encode("<|im_start|>user\n", add_special_tokens=False)) == 3  # the markers are single tokens


def test_tokenizer_was_trained_on_environment_text(tokenizer) -> None:
    # Words the env prompts use often are whole tokens; unseen text still encodes byte by byte.
    for word in ("Ġmove", "Ġarm", "Ġreward"):
        assert word in tokenizer.get_vocab(), word


@given(text=st.one_of(st.text(max_size=300), hostile_text()))
def test_decoding_gives_back_exactly_the_text(tokenizer, text: str) -> None:
    if any(special in text for special in ("<|im_start|>", "<|im_end|>", "<|endoftext|>")):
        return
    # NFC-normalised text comes back exactly; other text as its NFC form (Qwen2's normaliser, which transformers
    # 5 applies to every qwen2 model directory whatever tokenizer.json says).
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == unicodedata.normalize("NFC", text)


def test_the_loaded_tokenizer_is_the_trained_one(tiny_model_dir: Path, tokenizer) -> None:
    trained = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    loaded = tokenizer.backend_tokenizer
    assert repr(loaded.normalizer) == repr(trained.normalizer)
    assert repr(loaded.pre_tokenizer) == repr(trained.pre_tokenizer)
    text = "Arm B: reward 0.75 after 12 pulls; <move>C3</move>\n\n  done"
    assert tokenizer.encode(text, add_special_tokens=False) == trained.encode(text, add_special_tokens=False).ids


def test_building_again_reuses_the_directory(tiny_model_dir: Path) -> None:
    stamps = {path.name: path.stat().st_mtime_ns for path in tiny_model_dir.iterdir()}
    assert tiny_model(tiny_model_dir) == tiny_model_dir
    assert {path.name: path.stat().st_mtime_ns for path in tiny_model_dir.iterdir()} == stamps


def test_resolve_model_maps_only_tiny_to_the_built_directory(tiny_model_dir: Path) -> None:
    assert resolve_model("tiny") == tiny_model_dir
    assert resolve_model("some/other-model") == "some/other-model"
    assert resolve_model(Path("/models/x")) == Path("/models/x")


def test_the_model_depends_on_the_recipe_not_on_the_registered_environments(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Registering an environment (or losing one to a missing optional dependency) changes neither the cache
    # key nor a fresh build: the tokenizer corpus ships with the package and the weights come from a seed.
    assert _is_built(tiny_model_dir, TinyModelSpec())
    assert recipe_of(tiny_model_dir)["recipe_version"] == RECIPE_VERSION
    monkeypatch.setattr(registration, "env_ids", lambda: ["rl-llm/Added-v0"])
    assert _is_built(tiny_model_dir, TinyModelSpec())
    fresh = tiny_model(tmp_path / "fresh")
    assert (fresh / "tokenizer.json").read_text() == (tiny_model_dir / "tokenizer.json").read_text()
    cached = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    rebuilt = AutoModelForCausalLM.from_pretrained(fresh).state_dict()
    assert cached.keys() == rebuilt.keys()
    assert all(torch.equal(cached[name], rebuilt[name]) for name in cached)
    assert not _is_built(tiny_model_dir, TinyModelSpec(seed=1))


def test_pinned_recipe_fingerprint(tokenizer) -> None:
    # Recipe 1's tokenizer, pinned: if this changes, the recipe changed and RECIPE_VERSION must be bumped.
    assert RECIPE_VERSION == 1
    assert len(tokenizer) == PINNED_VOCAB
    assert tokenizer.encode("Pull 1 of 4. <action>B</action>", add_special_tokens=False) == PINNED_IDS


def test_other_settings_build_a_llama_and_a_foreign_directory_is_refused(tmp_path: Path) -> None:
    path = tiny_model(tmp_path / "llama", architecture="llama", hidden_size=64, num_heads=2, num_kv_heads=1)
    assert AutoConfig.from_pretrained(path).architectures == ["LlamaForCausalLM"]
    assert AutoModelForCausalLM.from_pretrained(path).config.hidden_size == 64
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="not a tiny rl-llm model"):
        tiny_model(tmp_path / "mine")
    with pytest.raises(ValueError, match="architecture"):
        tiny_model(tmp_path / "x", architecture="gpt2")
    assert (path / MARKER_FILE).exists()


def test_default_path_is_in_the_rl_llm_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RL_LLM_CACHE", str(tmp_path))
    assert default_tiny_model_path() == tmp_path / f"tiny-qwen2-r{RECIPE_VERSION}"
    monkeypatch.delenv("RL_LLM_CACHE")
    assert default_tiny_model_path() == Path.home() / ".cache" / "rl-llm" / f"tiny-qwen2-r{RECIPE_VERSION}"
