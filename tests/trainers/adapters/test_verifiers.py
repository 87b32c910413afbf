"""``load_environment`` as a verifiers ``MultiTurnEnv``, evaluated by verifiers' own loop against a real
OpenAI-compatible server (the vLLM CPU server of the tiny model); the rubric's reward is the env's return."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import pytest

pytest.importorskip("verifiers", reason="needs verifiers 0.2.x (classic MultiTurnEnv API): pip install 'verifiers<0.3'")

import verifiers as vf

if not hasattr(vf, "MultiTurnEnv"):  # verifiers >= 0.3 moved to a new API
    pytest.skip("needs the classic verifiers API (MultiTurnEnv, verifiers<0.3)", allow_module_level=True)

from rl_llm.trainers.adapters.verifiers_env import RLLMMultiTurnEnv, load_environment

BANDIT = "rl-llm/MultiArmedBandit-v0"


def test_load_environment_builds_the_env_dataset() -> None:
    env = load_environment(BANDIT, num_examples=3, seed=10, horizon=4)
    assert isinstance(env, RLLMMultiTurnEnv) and isinstance(env, vf.MultiTurnEnv)
    rows = list(env.eval_dataset)
    assert [row["info"]["rl_llm_task"]["seed"] for row in rows] == [10, 11, 12]
    reference = gym.make(BANDIT, horizon=4)
    observation, info = reference.reset(seed=10)
    assert [m["content"] for m in rows[0]["prompt"]] == [info["system_prompt"], observation]
    with pytest.raises(ValueError, match="unknown environment"):
        load_environment("rl-llm/Nope-v0", num_examples=1)


def _replay(conversation: list[Any], seed: int) -> float:
    """The return the env gives the assistant turns of ``conversation`` when stepped directly."""
    env = gym.make(BANDIT, horizon=3)
    env.reset(seed=seed)
    total, done = 0.0, False
    for message in conversation:
        role = message["role"] if isinstance(message, dict) else message.role
        if role == "assistant" and not done:
            content = message["content"] if isinstance(message, dict) else message.content
            _, reward, terminated, truncated, _ = env.step(content or "")
            total, done = total + reward, terminated or truncated
    assert done, "the rollout ended before the env did"
    return total


def test_verifiers_evaluate_against_a_real_server(vllm_server: Any) -> None:
    from openai import AsyncOpenAI
    from verifiers.clients.openai_chat_completions_client import OpenAIChatCompletionsClient

    env = load_environment(BANDIT, num_examples=2, horizon=3)
    client = OpenAIChatCompletionsClient(AsyncOpenAI(base_url=f"{vllm_server.url}/v1", api_key="unused"))
    results = env.evaluate_sync(
        client, model=vllm_server.model, sampling_args={"max_tokens": 8, "temperature": 1.0},
        num_examples=2, rollouts_per_example=2,
    )  # fmt: skip
    outputs = results["outputs"]
    assert len(outputs) == 4
    for output in outputs:
        assert output.get("error") is None
        seed = output["info"]["rl_llm_task"]["seed"]
        conversation = list(output["prompt"]) + list(output["completion"])
        # Every rollout ran the env to its end (3 pulls), and its reward is the env's return for those turns.
        assert sum(1 for m in conversation if (m["role"] if isinstance(m, dict) else m.role) == "assistant") == 3
        assert output["reward"] == pytest.approx(_replay(conversation, seed))
