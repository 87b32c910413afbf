"""rl-llm environments as verifiers ``MultiTurnEnv``\\ s: ``load_environment(env_id, **kwargs)``.

verifiers 0.2 (the classic ``MultiTurnEnv`` API of 0.1.x-0.2.x, which prime-rl and the Environments Hub
load through a module's ``load_environment``; ``pip install 'verifiers>=0.2,<0.3'``, no extra holds it: see
docs/verifiers.md#the-two-verifiers-apis; verifiers 0.4 is ``integrations/verifiers_v1.py``) runs rollouts against any
OpenAI-compatible endpoint and scores them with a rubric. Here each rollout owns one rl-llm env: the
dataset rows hold the env's opening conversation for a seed, every assistant turn is stepped through the
env, the env's reply is the next user message, and the episode ends when the env says so. The rubric's one
reward function is the episode's return in the env (its components and final metrics are kept in
``state["rl_llm"]``)::

    from openai import AsyncOpenAI
    from verifiers.clients.openai_chat_completions_client import OpenAIChatCompletionsClient
    from rl_llm.integrations.verifiers_env import load_environment

    env = load_environment("rl-llm/TicTacToe-v0", num_examples=32, opponent="minimax")
    client = OpenAIChatCompletionsClient(AsyncOpenAI(base_url="http://localhost:8000/v1", api_key="x"))
    results = env.evaluate_sync(client, model="my-model", num_examples=8, rollouts_per_example=2)

An Environments Hub package needs only a module whose ``load_environment`` calls this one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import verifiers as vf

if not hasattr(vf, "MultiTurnEnv"):  # verifiers >= 0.3: the classic API is gone
    raise ImportError(f"rl_llm.integrations.verifiers_env is the verifiers 0.2 adapter; verifiers "
                      f"{getattr(vf, '__version__', '?')} is installed: use rl_llm.integrations.verifiers_v1")

from rl_llm import checks
from rl_llm.integrations.generic import MessageEnv, checked_mapping
from rl_llm.integrations.social_seat import make_env

TASK_KEY = "rl_llm_task"


def _content(message: Any) -> str:
    """The text of a chat message, whether a dict or one of verifiers' pydantic messages."""
    content = message.get("content") if isinstance(message, Mapping) else getattr(message, "content", None)
    if isinstance(content, list):  # content parts: keep the text ones
        return "".join(part.get("text", "") if isinstance(part, Mapping) else str(getattr(part, "text", "")) for part in content)
    return content or ""


class EnvError(vf.Error):
    """The rl-llm env raised during a rollout. verifiers' rollout loop records a ``vf.Error`` in
    ``state["error"]`` and ends that rollout only; any other exception escapes ``rollout`` and aborts the whole
    ``generate`` with every other rollout in it (docs/design.md#agents-and-the-episode-loop: an error in one
    environment ends that episode only)."""


class RLLMMultiTurnEnv(vf.MultiTurnEnv):
    """A verifiers ``MultiTurnEnv`` driving one rl-llm env per rollout."""

    def __init__(self, env_id: str, env_kwargs: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # Not ``env_id``: verifiers' Environment has its own attribute of that name.
        self.rl_llm_env_id, self.rl_llm_kwargs = env_id, dict(env_kwargs or {})
        self._envs: dict[str, MessageEnv] = {}  # by trajectory id; envs are not kept in the (serialized) state

    async def setup_state(self, state: vf.State) -> vf.State:
        env = MessageEnv(make_env(self.rl_llm_env_id, **self.rl_llm_kwargs))
        info = state.get("info") or {}
        task = info.get(TASK_KEY) if isinstance(info, Mapping) else None
        try:
            await asyncio.to_thread(env.reset, dict(task) if task else None)
        except Exception as error:
            await asyncio.to_thread(env.close)  # not in self._envs yet, so close_env would never see it
            raise EnvError(f"{self.rl_llm_env_id} reset failed: {error!r}") from error
        self._envs[state["trajectory_id"]] = env
        state["rl_llm"] = {"return": 0.0, "turns": 0, "reward_components": {}, "metrics": {}, "task_id": env.task_id}
        return state

    async def env_response(self, messages: Sequence[Any], state: vf.State, **kwargs: Any) -> list[dict[str, str]]:
        env = self._envs[state["trajectory_id"]]
        try:
            new_messages, reward, done, info = await asyncio.to_thread(env.step, _content(messages[-1]))
        except Exception as error:
            raise EnvError(f"{self.rl_llm_env_id} step failed: {error!r}") from error
        record = state["rl_llm"]
        record["return"] += reward
        record["turns"] += 1
        for name, value in (info.get("reward_components") or {}).items():
            record["reward_components"][name] = record["reward_components"].get(name, 0.0) + float(value)
        record["metrics"] = info.get("metrics") or {}
        if done:
            state["final_env_response"] = []  # ends the rollout (verifiers' own stop condition)
            return []
        return new_messages  # the env's reply as the next user message

    @vf.cleanup
    async def close_env(self, state: vf.State) -> None:
        env = self._envs.pop(state.get("trajectory_id", ""), None)
        if env is not None:
            await asyncio.to_thread(env.close)


async def env_return(state: vf.State, **_: Any) -> float:
    """The episode's return in the rl-llm env."""
    return float((state.get("rl_llm") or {}).get("return", 0.0))


def make_dataset(env_id: str, seeds: Sequence[int], options: Mapping[str, Any] | None = None, **env_kwargs: Any) -> Any:
    """A ``datasets.Dataset`` of the env's opening conversations: ``prompt``, ``answer`` (empty), ``info``."""
    from datasets import Dataset

    seeds, options = checks.seed_list(seeds), checked_mapping("options", options)  # before an env is made
    env = MessageEnv(make_env(env_id, **env_kwargs))
    rows = []
    try:
        for seed in seeds:
            task = {"seed": seed, "options": options}
            rows.append({"prompt": env.reset(task), "answer": "", "info": {TASK_KEY: task, "env_id": env_id}})
    finally:
        env.close()
    return Dataset.from_list(rows)


def load_environment(env_id: str = "rl-llm/TicTacToe-v0", num_examples: int = 64, seed: int = 0,
                     options: Mapping[str, Any] | None = None, **env_kwargs: Any) -> RLLMMultiTurnEnv:  # fmt: skip
    """A verifiers environment for ``env_id``: ``num_examples`` episodes (seeds ``seed..``) as its dataset and
    eval dataset, rewarded by the env's own return."""
    dataset = make_dataset(env_id, range(seed, seed + num_examples), options, **env_kwargs)
    rubric = vf.Rubric(funcs=[env_return], weights=[1.0])
    return RLLMMultiTurnEnv(env_id, env_kwargs, dataset=dataset, eval_dataset=dataset, rubric=rubric, max_turns=-1)
