"""Fixtures for the agent tests: the tiny local model, built once into the rl-llm cache and reused.

The cache is ``$RL_LLM_CACHE`` (default ``~/.cache/rl-llm``); the model is rebuilt when its recipe changes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rl_llm.agents.tiny import tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    return tiny_model()


@pytest.fixture
def make_tiny_policy(tiny_model_dir: Path) -> Iterator[Callable[..., object]]:
    """``make_tiny_policy(temperature=0.7, max_new_tokens=16, ...)`` -> an ``HFPolicy`` on CPU in float32
    (closed after the test)."""
    from rl_llm.agents.hf import HFPolicy
    from rl_llm.agents.llm import SamplingParams

    made: list[HFPolicy] = []

    def make(seed: int = 0, max_batch_size: int = 64, **sampling: float) -> HFPolicy:
        sampling.setdefault("max_new_tokens", 16)
        made.append(HFPolicy(tiny_model_dir, sampling=SamplingParams(**sampling), device="cpu", seed=seed,
                             max_batch_size=max_batch_size))  # fmt: skip
        return made[-1]

    yield make
    for policy in made:
        policy.close()
