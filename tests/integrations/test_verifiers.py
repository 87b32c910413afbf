"""``load_environment`` as a verifiers ``MultiTurnEnv``, evaluated by verifiers' own loop against a real
OpenAI-compatible server (the vLLM CPU server of the tiny model); the rubric's reward is the env's return."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

from tests.extras import import_extra, required_extras

# "verifiers02" in RL_LLM_REQUIRE_EXTRAS: .ci/run installed verifiers 0.2 (the command `rl-llm doctor` prints),
# so it must import. verifiers >= 0.4 is tested in test_verifiers_v1.py and test_verifiers_hub.py.
vf = import_extra("verifiers", "verifiers02", "verifiers 0.2 (the classic MultiTurnEnv API): "
                  "pip install 'verifiers>=0.2,<0.3' 'datasets>=3'")  # fmt: skip
if not hasattr(vf, "MultiTurnEnv") and "verifiers02" not in required_extras():
    pytest.skip("needs the classic verifiers API (MultiTurnEnv, verifiers<0.3)", allow_module_level=True)

from rl_llm.integrations.verifiers_env import RLLMMultiTurnEnv, load_environment  # noqa: E402
from rl_llm.integrations.verifiers_hub import write_hub_package  # noqa: E402

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


def test_hub_package_gives_the_classic_env_under_verifiers_0_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = write_hub_package(BANDIT, tmp_path, horizon=4)
    monkeypatch.syspath_prepend(str(root))
    module = importlib.import_module("rl_llm_multi_armed_bandit")
    try:
        assert module.__all__ == ["load_environment"]  # verifiers 0.2 loads environments by this function
        env = module.load_environment(num_examples=2, seed=5)
        assert isinstance(env, RLLMMultiTurnEnv) and env.rl_llm_kwargs == {"horizon": 4}
        assert [row["info"]["rl_llm_task"]["seed"] for row in env.eval_dataset] == [5, 6]
    finally:
        sys.modules.pop("rl_llm_multi_armed_bandit", None)


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


def test_an_env_error_ends_its_own_rollout_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """An env raising in reset or step is that rollout's ``error``; the other rollouts of the same ``generate``
    still run to the end (before, the exception escaped verifiers' rollout loop and aborted the whole run)."""
    from openai.types.chat import ChatCompletion
    from verifiers.clients.openai_chat_completions_client import OpenAIChatCompletionsClient

    import rl_llm.integrations.verifiers_env as adapter

    class Scripted(OpenAIChatCompletionsClient):  # the model always pulls arm 1
        async def get_native_response(self, prompt: Any, model: str, sampling_args: Any, tools: Any = None, **_: Any) -> Any:
            return ChatCompletion.model_validate({
                "id": "x", "object": "chat.completion", "created": 0, "model": model,
                "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "<arm>1</arm>"}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            })  # fmt: skip

    closed: list[int | None] = []

    class Faulty(gym.Wrapper):  # seed 10 fails in step, seed 11 in reset, seed 12 works
        def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
            self.seed_ = seed
            if seed == 11:
                raise RuntimeError("reset exploded")
            return self.env.reset(seed=seed, options=options)

        def step(self, action: str) -> Any:
            if self.seed_ == 10:
                raise RuntimeError("step exploded")
            return self.env.step(action)

        def close(self) -> None:
            closed.append(getattr(self, "seed_", None))
            self.env.close()

    env = load_environment(BANDIT, num_examples=3, seed=10, horizon=3)
    make_env = adapter.make_env
    monkeypatch.setattr(adapter, "make_env", lambda env_id, **kwargs: Faulty(make_env(env_id, **kwargs)))
    results = env.evaluate_sync(Scripted(object()), model="m", num_examples=3, rollouts_per_example=2)
    outputs = {(output["info"]["rl_llm_task"]["seed"], n): output for n, output in enumerate(results["outputs"])}
    assert len(outputs) == 6
    for (seed, _), output in outputs.items():
        if seed == 12:
            assert output.get("error") is None and output["reward"] == pytest.approx(_replay(
                list(output["prompt"]) + list(output["completion"]), seed))
        else:
            assert "exploded" in output["error"]["message"]
    assert sorted(closed) == [10, 10, 11, 11, 12, 12] and not env._envs  # every env closed, none kept
