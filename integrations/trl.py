"""Run rl-llm environments inside TRL's ``GRPOTrainer``, through its ``rollout_func`` extension point.

TRL (>= 0.23) lets a trainer replace its single-turn generation with ``rollout_func(prompts, trainer)``,
which returns token ids, log-probs and an ``env_mask`` (1 on model tokens, 0 on tokens the environment
wrote) plus any extra fields, which TRL hands to the reward functions. ``EnvRollout`` fills it with the
rl-llm rollout engine: every prompt is one episode, played to the end with the trainer's own model (the hf
backend shares the module being trained), token-in/token-out, so the loss sees exactly the sampled tokens
and env tokens are masked out. The episode's return comes back as ``env_reward``; ``env_reward`` (the
function) passes it to GRPO as the reward::

    from trl import GRPOConfig, GRPOTrainer
    from rl_llm.integrations.generic import EnvFactory
    from rl_llm.integrations.trl import EnvRollout, env_reward, make_trl_dataset

    factory = EnvFactory("rl-llm/TicTacToe-v0", opponent="random")
    trainer = GRPOTrainer(
        model=model_dir, args=GRPOConfig(num_generations=4, ...),
        train_dataset=make_trl_dataset(factory, seeds=range(256)),
        rollout_func=EnvRollout(factory, max_new_tokens=64),
        reward_funcs=[env_reward],
    )

Dataset rows hold the env's real opening conversation (so TRL's logs show real prompts); each message also
carries the episode's seed and reset options under ``rl_llm_task``, which is how the rollout finds its
task again (TRL passes ``rollout_func`` the prompts only). Pass a ``RayEnvPool`` as the env factory to run
the environments on a Ray cluster. Episodes that fail (an env error) get a ``None`` reward, which GRPO
treats as unscorable (no advantage), and are counted in ``EnvRollout.failed``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import gymnasium as gym

from rl_llm import checks
from rl_llm.integrations.generic import MessageEnv, checked_mapping, parse_task
from rl_llm.types import TokenRole, Trajectory

TASK_KEY = "rl_llm_task"


def make_trl_dataset(env_factory: Callable[[], gym.Env], seeds: Iterable[int], options: Mapping[str, Any] | None = None):
    """A ``datasets.Dataset`` with one ``prompt`` (the env's opening messages) per seed."""
    from datasets import Dataset

    seeds, options = checks.seed_list(seeds), checked_mapping("options", options)
    env = MessageEnv(env_factory())
    rows = []
    try:
        for seed in seeds:
            task = json.dumps({"seed": seed, "options": options})
            messages = [m for m in env.reset({"seed": seed, "options": options}) if m["content"]]
            rows.append({"prompt": [{**message, TASK_KEY: task} for message in messages]})
    finally:
        env.close()
    return Dataset.from_list(rows)


def task_of(prompt: Sequence[Mapping[str, Any]] | str) -> tuple[int | None, dict[str, Any]]:
    """The ``(seed, options)`` a dataset prompt was built from."""
    if not isinstance(prompt, str):
        for message in prompt:
            value = message.get(TASK_KEY) if isinstance(message, Mapping) else None
            if value:
                return parse_task(json.loads(value))
    raise ValueError(
        f"this prompt carries no {TASK_KEY!r} field; build the train dataset with make_trl_dataset(env_factory, seeds)"
    )


def trajectory_to_sample(trajectory: Trajectory) -> tuple[list[int], list[int], list[int], list[float]]:
    """``(prompt_ids, completion_ids, env_mask, logprobs)``: the opening prompt, then every later token."""
    roles = trajectory.token_roles
    split = next((i for i, role in enumerate(roles) if role != TokenRole.PROMPT), len(roles))
    completion_roles = roles[split:]
    if not completion_roles:
        raise RuntimeError(f"episode seed={trajectory.seed} produced no tokens: {trajectory.error or 'empty trajectory'}")
    mask = [int(role == TokenRole.POLICY) for role in completion_roles]
    return trajectory.token_ids[:split], trajectory.token_ids[split:], mask, trajectory.logprobs[split:]


class EnvRollout:
    """A ``rollout_func`` for ``GRPOTrainer``: each prompt is played as one whole episode of the env.

    ``max_new_tokens`` bounds each turn; ``engine_options`` go to ``RolloutEngine`` (``concurrency``,
    ``max_context_tokens``, ``env_workers``...). Sampling follows the trainer's ``temperature``/``top_p``/
    ``top_k``.
    """

    def __init__(self, env_factory: Callable[[], gym.Env], max_new_tokens: int = 64, **engine_options: Any) -> None:
        self.env_factory = env_factory
        # 0 or NaN reached the model's generate at the first batch, deep in the trainer
        self.max_new_tokens = checks.integer("max_new_tokens", max_new_tokens, minimum=1)
        self.engine_options = engine_options
        self.failed = 0
        self.last_trajectories: list[Trajectory] = []  # the latest batch, for logging and inspection
        self._policy: Any = None

    def policy_for(self, trainer: Any) -> Any:
        """An hf policy generating with the trainer's own (unwrapped) model, rebuilt if the model changes."""
        from rl_llm.agents.hf import HFPolicy
        from rl_llm.agents.llm import SamplingParams

        model = trainer.accelerator.unwrap_model(trainer.model)
        if hasattr(model, "get_base_model"):  # peft: LoRA layers live inside the base model's modules
            model = model.get_base_model()
        if self._policy is None or self._policy.model is not model:
            sampling = SamplingParams(
                max_new_tokens=self.max_new_tokens, temperature=trainer.temperature,
                top_p=trainer.top_p, top_k=trainer.top_k or 0,
            )  # fmt: skip
            self._policy = HFPolicy(model, trainer.processing_class, sampling=sampling)
        self._policy.mark_updated(int(trainer.state.global_step))
        return self._policy

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        from rl_llm.agents.rollout import EpisodeJob, RolloutEngine

        # TRL repeats each prompt num_generations times: number the repeats, so each is its own group member.
        repeats: dict[str, int] = {}
        jobs = []
        for seed, options in map(task_of, prompts):
            key = json.dumps([seed, options], sort_keys=True, default=str)
            repeats[key] = repeats.get(key, -1) + 1
            jobs.append(EpisodeJob(seed=seed, options=options, group_index=repeats[key]))
        engine = RolloutEngine(self.policy_for(trainer), self.env_factory, max_new_tokens=self.max_new_tokens, **self.engine_options)
        trajectories = self.last_trajectories = engine.run(jobs)
        output: dict[str, list[Any]] = {key: [] for key in ("prompt_ids", "completion_ids", "env_mask", "logprobs")}
        output |= {"env_reward": [], "task_id": [], "env_turns": []}
        for trajectory in trajectories:
            for key, value in zip(("prompt_ids", "completion_ids", "env_mask", "logprobs"), trajectory_to_sample(trajectory)):
                output[key].append(value)
            self.failed += trajectory.error is not None
            output["env_reward"].append(None if trajectory.error is not None else trajectory.total_reward)
            output["task_id"].append(trajectory.task_id)
            output["env_turns"].append(len(trajectory.turns))
        return output


def env_reward(completions: list[Any], env_reward: list[float | None] | None = None, **_: Any) -> list[float | None]:
    """GRPO reward function: the episode return each rollout got from its env (``None`` for failed episodes)."""
    if env_reward is None:
        raise ValueError("no env_reward field: pass rollout_func=EnvRollout(...) to GRPOTrainer")
    if len(env_reward) != len(completions):
        raise ValueError(f"{len(env_reward)} env rewards for {len(completions)} completions")
    return list(env_reward)
