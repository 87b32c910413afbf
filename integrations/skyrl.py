"""rl-llm environments as SkyRL-gym ``BaseTextEnv``\\ s, registered in skyrl_gym's own registry.

SkyRL's trainer builds one env per rollout with ``skyrl_gym.make(env_class, env_config=..., extras=row_extras)``,
calls ``init(prompt)`` for the opening conversation and ``step(llm_text)`` until ``done``. After
``register_skyrl_envs()`` every rl-llm env id (``rl-llm/TicTacToe-v0``...) and every parallel social game
(``social/prisoners_dilemma_v0``..., one seat against a baseline) is an ``env_class`` there::

    import skyrl_gym
    from rl_llm.integrations.skyrl import make_skyrl_dataset, register_skyrl_envs

    register_skyrl_envs()
    rows = make_skyrl_dataset("rl-llm/TicTacToe-v0", seeds=range(256), opponent="minimax")  # to parquet for SkyRL
    env = skyrl_gym.make("rl-llm/TicTacToe-v0", env_config={"opponent": "minimax"}, extras=rows[0])
    chat, _ = env.init(rows[0]["prompt"])
    out = env.step("<move>B2</move>")          # {"observations": [...], "reward", "done", "metadata"}

``env_config`` holds the env's constructor kwargs (SkyRL passes ``generator.skyrl_gym.<env_class>`` from its
config); a dataset row's ``extra_info.rl_llm_task`` (``{"seed", "options"}``, as JSON) picks the episode. ``init``
replaces the prompt with the env's own opening (system prompt + first observation), which is also what
``make_skyrl_dataset`` stored. ``metadata`` is rl-llm's step info (reward components, metrics, task_id).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

from rl_llm import checks
from rl_llm.integrations.generic import MessageEnv, checked_mapping
from rl_llm.integrations.social_seat import SOCIAL_PREFIX, make_env

TASK_KEY = "rl_llm_task"


def _plain(config: Any) -> dict[str, Any]:
    """A plain dict from SkyRL's ``env_config`` (None, a dict or an OmegaConf ``DictConfig``)."""
    if config is None:
        return {}
    if hasattr(config, "_metadata"):  # OmegaConf containers
        from omegaconf import OmegaConf

        return dict(OmegaConf.to_container(config, resolve=True))
    return dict(config)


class RLLMSkyRLEnv(BaseTextEnv):
    """One rl-llm env behind SkyRL-gym's ``init`` / ``step`` / ``close``."""

    def __init__(
        self, env_config: Any = None, extras: Mapping[str, Any] | None = None, env_id: str | None = None
    ) -> None:
        super().__init__()
        config = _plain(env_config)
        config.pop("env_class", None)  # SkyRL's own key in some configs
        self.env_id = env_id or config.pop("env_id", None)
        if not self.env_id:
            raise ValueError("no rl-llm env id: register_skyrl_envs() or pass env_config={'env_id': ...}")
        extras = dict(extras or {})
        info = extras.get("extra_info") or {}
        task = extras.get(TASK_KEY) or (info.get(TASK_KEY) if isinstance(info, Mapping) else None)
        self.task: Mapping[str, Any] | None = json.loads(task) if isinstance(task, str) else task
        self.messages = MessageEnv(make_env(self.env_id, **config))
        self.max_turns = int(
            getattr(self.messages.env.unwrapped, "max_turns", 0) or extras.get("max_turns", 1)
        )
        self.total_reward = 0.0
        self.last_info: dict[str, Any] = {}

    def init(self, prompt: Any = None) -> tuple[list[dict[str, str]], dict[str, Any]]:
        self.turns, self.total_reward = 0, 0.0
        messages = self.messages.reset(dict(self.task) if self.task else None)
        return messages, {"task_id": self.messages.task_id, **self.messages.reset_info}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        self.turns += 1
        observations, reward, done, info = self.messages.step(action)
        self.total_reward += reward
        self.last_info = info
        return BaseTextEnvStepOutput(observations=observations, reward=reward, done=done, metadata=info)

    def get_metrics(self) -> dict[str, Any]:
        metrics = {
            key: value
            for key, value in (self.last_info.get("metrics") or {}).items()
            if isinstance(value, (int, float))
        }
        return {**metrics, "return": self.total_reward, "turns": self.turns}

    def close(self) -> None:
        self.messages.close()


def skyrl_env_ids() -> list[str]:
    """Every rl-llm env id plus ``social/<game>`` for the parallel social games."""
    from rl_llm.envs.registration import env_ids
    from rl_llm.envs.social import GAMES

    return env_ids() + [
        SOCIAL_PREFIX + game for game in GAMES if game != "tictactoe_v0"
    ]  # AEC tic-tac-toe: rl-llm/TicTacToe-v0


def register_skyrl_envs() -> list[str]:
    """Register every rl-llm env with skyrl_gym (idempotent); returns the ids."""
    from skyrl_gym.envs.registration import register, registry

    ids = skyrl_env_ids()
    for env_id in ids:
        if env_id not in registry:
            register(id=env_id, entry_point=f"{__name__}:RLLMSkyRLEnv", kwargs={"env_id": env_id})
    return ids


def make_skyrl_dataset(env_id: str, seeds: Iterable[int], options: Mapping[str, Any] | None = None,
                       **env_kwargs: Any) -> list[dict[str, Any]]:  # fmt: skip
    """SkyRL dataset rows (``prompt``, ``env_class``, ``extra_info``), one per seed; write them to parquet."""
    seeds, options = checks.seed_list(seeds), checked_mapping("options", options)  # before an env is made
    env = MessageEnv(make_env(env_id, **env_kwargs))
    rows = []
    try:
        for seed in seeds:
            task = {"seed": seed, "options": options}
            # The task goes in as JSON (as in integrations/verl.py): SkyRL reads its dataset from parquet, which
            # cannot store the empty ``options`` struct and would merge different rows' options into one schema.
            rows.append({"prompt": env.reset(task), "env_class": env_id, "extra_info": {TASK_KEY: json.dumps(task)}})
    finally:
        env.close()
    return rows
