"""Run rl-llm environments inside verl, as a verl agent loop (``verl.experimental.agent_loop``, verl >= 0.5).

verl's ``AgentLoopWorker`` runs one agent loop coroutine per sample: it gets the dataset row and a client
of verl's inference servers and returns the sample's token ids, response mask (1 = model token) and
reward. ``RLLMAgentLoop`` (registered as ``rl_llm_env``) plays one whole rl-llm episode there: it resets
the env named in the row, generates each turn through ``server_manager.generate`` (with the env's stop
strings and a per-turn token budget), steps the env off the event loop, appends the env's reply through
verl's own incremental tokenisation (``ct_merge_context_msg``, env tokens masked out), and returns the
episode return as ``reward_score`` (per-turn rewards in ``extra_fields["turn_scores"]``).

Wiring (see ``configs/verl/``): write a dataset with :func:`write_verl_dataset`, point
``actor_rollout_ref.rollout.agent.agent_loop_config_path`` at ``configs/verl/agent_loops.yaml`` and set
``actor_rollout_ref.rollout.agent.default_agent_loop=rl_llm_env``. Each row's ``extra_info["rl_llm"]`` is a
JSON string ``{"env_id", "env_kwargs", "seed", "options"}``; ``env_id``/``env_kwargs`` may instead be set
once for all rows in the agent loop's config entry.

This module imports without verl; ``RLLMAgentLoop`` is built (and registered with verl) on first access.
"""

from __future__ import annotations

import asyncio
import functools
import json
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from rl_llm import checks
from rl_llm.integrations.generic import EnvFactory, MessageEnv, TaskSpec, checked_mapping

AGENT_NAME = "rl_llm_env"
TASK_FIELD = "rl_llm"


def task_json(env_id: str, seed: int | None, env_kwargs: Mapping[str, Any] | None = None, options: Mapping[str, Any] | None = None) -> str:
    return json.dumps({"env_id": env_id, "env_kwargs": dict(env_kwargs or {}), "seed": seed, "options": dict(options or {})})


def verl_rows(
    env_id: str, seeds: Iterable[int], env_kwargs: Mapping[str, Any] | None = None, options: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    """Dataset rows for verl's ``RLHFDataset``: the env's opening messages as ``prompt`` plus the task."""
    env_kwargs, options = checked_mapping("env_kwargs", env_kwargs), checked_mapping("options", options)
    seeds = checks.seed_list(seeds)
    env = MessageEnv(EnvFactory(env_id, **env_kwargs))
    rows = []
    try:
        for index, seed in enumerate(seeds):
            messages = env.reset({"seed": seed, "options": options})
            rows.append({
                "data_source": env_id,
                "prompt": [m for m in messages if m["content"]],
                "agent_name": AGENT_NAME,
                "reward_model": {"style": "env", "ground_truth": ""},
                "extra_info": {"index": index, TASK_FIELD: task_json(env_id, seed, env_kwargs, options)},
            })  # fmt: skip
    finally:
        env.close()
    return rows


def write_verl_dataset(path: str | Path, rows: list[dict[str, Any]]) -> Path:
    """Write rows as the parquet file verl's ``data.train_files`` expects."""
    import pandas as pd

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(path)
    return path


def episode_spec(
    sample: Mapping[str, Any], default_env_id: str | None = None, default_env_kwargs: Mapping[str, Any] | None = None
) -> tuple[EnvFactory, TaskSpec]:
    """The env factory and task of one verl sample (its dataset row's fields)."""
    extra = sample.get("extra_info") or {}
    raw = extra.get(TASK_FIELD) if isinstance(extra, Mapping) else None
    spec = json.loads(raw) if isinstance(raw, str) else dict(raw or {})
    env_id = spec.pop("env_id", None) or default_env_id
    if not env_id:
        raise ValueError(
            f"no env for this sample: set extra_info[{TASK_FIELD!r}] (see verl_rows) or env_id in the agent loop config"
        )
    env_kwargs = {**dict(default_env_kwargs or {}), **dict(spec.pop("env_kwargs", None) or {})}
    return EnvFactory(env_id, **env_kwargs), {"seed": spec.get("seed"), "options": spec.get("options") or {}}


def __getattr__(name: str) -> Any:
    if name == "RLLMAgentLoop":
        return _agent_loop_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def _agent_loop_class() -> type:
    try:
        from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, register
        from verl.utils.profiler import simple_timer
    except ImportError as error:
        raise ImportError(f"the verl adapter needs verl's agent loop API (pip install 'rl-llm[verl]'): {error}") from error

    class RLLMAgentLoop(AgentLoopBase):
        """One rl-llm episode per sample. Config-entry kwargs: ``env_id``, ``env_kwargs`` (defaults for rows
        without them) and ``max_new_tokens`` (per turn; default: the remaining ``response_length``)."""

        def __init__(
            self,
            *args: Any,
            env_id: str | None = None,
            env_kwargs: Mapping[str, Any] | None = None,
            max_new_tokens: int | None = None,
            **kwargs: Any,
        ) -> None:
            kwargs.pop("name", None)  # the registry entry's own name, passed along by hydra
            kwargs.pop("tools", None)  # rl-llm envs parse their own actions
            super().__init__(*args, **kwargs)
            self.env_id, self.env_kwargs = env_id, dict(env_kwargs or {})
            self.max_new_tokens = max_new_tokens
            self.response_length = int(self.rollout_config.response_length)

        async def run(self, sampling_params: dict[str, Any], priority: int = 0, **kwargs: Any) -> AgentLoopOutput:
            factory, task = episode_spec(kwargs, self.env_id, self.env_kwargs)
            loop = asyncio.get_running_loop()
            env = await loop.run_in_executor(None, MessageEnv, factory)
            try:
                return await self._play(env, task, sampling_params, int(priority))  # may come as np.int64
            finally:
                await loop.run_in_executor(None, env.close)

        async def _play(
            self, env: MessageEnv, task: TaskSpec, sampling_params: dict[str, Any], priority: int
        ) -> AgentLoopOutput:
            loop = asyncio.get_running_loop()
            messages = await loop.run_in_executor(None, env.reset, task)
            stop = [s for s in env.reset_info.get("stop", []) if s]
            runtime_ids = await self.ct_build_initial_tokens(messages)
            mask: list[int] = []
            logprobs: list[float] | None = None
            rewards: list[float] = []
            info: dict[str, Any] = {}
            env_error: str | None = None
            timing: dict[str, float] = {}
            # one id per episode, so every turn goes to the server holding its prefix (verl's sticky sessions);
            # under full determinism it follows the sample, as in verl's own agent loops
            deterministic = getattr(self.rollout_config, "full_determinism", False)
            request_id = f"det-{priority}" if deterministic else uuid.uuid4().hex
            while len(mask) < self.response_length:
                budget = self.response_length - len(mask)
                params = {**sampling_params, "max_tokens": min(self.max_new_tokens or budget, budget)}
                if stop:
                    params |= {"stop": stop, "include_stop_str_in_output": True}
                with simple_timer("generate_sequences", timing):
                    output = await self.server_manager.generate(
                        request_id=request_id, prompt_ids=runtime_ids, sampling_params=params, priority=priority
                    )
                if logprobs is None and output.log_probs:
                    logprobs = [0.0] * len(mask)  # only reached on the first turn, where mask is empty
                merged, mask, logprobs = await self.ct_merge_assistant_token(
                    runtime_ids, output.token_ids, mask, logprobs, assistant_logprobs=output.log_probs or None
                )
                runtime_ids = merged.token_ids
                action = self.tokenizer.decode(output.token_ids, skip_special_tokens=True)
                messages.append({"role": "assistant", "content": action})
                try:
                    new_messages, reward, done, info = await loop.run_in_executor(None, env.step, action)
                except Exception as error:
                    # An env error ends this episode only (docs/design.md#agents-and-the-episode-loop): raised out
                    # of run, it would fail verl's whole batch (AgentLoopWorker gathers every sample's loop), so
                    # the episode stops here with the rewards it had and says why in extra_fields["env_error"].
                    env_error = f"{type(error).__name__}: {error}"
                    break
                rewards.append(reward)
                if done:
                    break
                previous = list(messages)
                messages.extend(new_messages)
                merged, new_mask, new_logprobs = await self.ct_merge_context_msg(
                    previous, messages, runtime_ids, mask, logprobs
                )
                if len(new_mask) >= self.response_length:
                    break  # no room left to generate after the observation
                runtime_ids, mask, logprobs = merged.token_ids, new_mask, new_logprobs
            split = len(runtime_ids) - len(mask)
            limit = self.response_length
            return AgentLoopOutput(
                prompt_ids=runtime_ids[:split],
                response_ids=runtime_ids[split:][:limit],
                response_mask=mask[:limit],
                response_logprobs=logprobs[:limit] if logprobs else None,
                reward_score=float(sum(rewards)),
                num_turns=len(messages) - (messages[0]["role"] == "system"),
                metrics=timing,
                extra_fields={
                    "turn_scores": rewards, "tool_rewards": [], "task_id": env.task_id,
                    "env_metrics": info.get("metrics", {}), "episode_done": env.done, "env_error": env_error,
                },
            )  # fmt: skip

    # verl resolves registered loops by "<module>.<qualname>" through hydra: make that this module's attribute.
    RLLMAgentLoop.__module__, RLLMAgentLoop.__qualname__ = __name__, "RLLMAgentLoop"
    return register(AGENT_NAME)(RLLMAgentLoop)

