"""rl-llm environments in the current verifiers API (``verifiers.v1``: tasksets, harnesses, ``Env``).

verifiers 0.4 replaced the classic ``MultiTurnEnv`` (``integrations/verifiers_env.py`` keeps that one for
verifiers 0.2) with three parts: a ``Taskset`` yields tasks, a harness runs the model (here the tool-less
``null`` chat loop), and an ``Env`` drives one episode through ``agent.interaction(task)``, in which the env
is the user. That is exactly an rl-llm episode: the task is the env's opening conversation for a seed, every
assistant reply is stepped through the env, the env's observation is the next user turn, and the episode
ends when the env says so. The trace's one reward, ``rl_llm_return``, is the episode's return; the reward
components and final metrics are recorded as metrics (docs/verifiers.md#the-current-api).

verifiers finds an environment by a top-level module name (``vf-eval rl-llm-tic-tac-toe``), the form the
Environments Hub installs: ``integrations/verifiers_hub.py`` writes such a package for any env, whose
module exports :class:`RLLMEnv` and a subclass of :class:`RLLMTaskset` bound to that env::

    python -m rl_llm.integrations.verifiers_hub --env rl-llm/TicTacToe-v0 --out environments -k opponent=minimax
    pip install -e environments/rl_llm_tic_tac_toe
    vf-eval rl-llm-tic-tac-toe -n 8 -r 2 --model MODEL --client.base-url http://localhost:8000/v1 --no-push
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from importlib.metadata import version
from typing import Any

from packaging.version import Version

# verifiers 0.2 ships an early, different `verifiers.v1`: the release decides, not whether the module imports.
VERIFIERS_VERSION = version("verifiers")
if Version(VERIFIERS_VERSION) < Version("0.4"):
    raise ImportError(f"rl_llm.integrations.verifiers_v1 needs verifiers>=0.4 (the current verifiers.v1 API); "
                      f"verifiers {VERIFIERS_VERSION} is installed: use rl_llm.integrations.verifiers_env")

# After the check: with verifiers 0.2 these imports may fail in ways that do not say why.
import verifiers.v1 as vf  # noqa: E402
from pydantic import Field  # noqa: E402
from verifiers.v1.types import content_text  # noqa: E402

from rl_llm.integrations.social_seat import make_env  # noqa: E402

# The null harness: verifiers' own tool-less chat loop, so the model's reply is the action text as generated.
# It runs no model-written code, so it runs on this host (subprocess) by default instead of verifiers' default
# remote Prime sandbox, which needs a Prime account; `--env.agent.runtime.type docker|prime` moves it.
CHAT_HARNESS = {"id": "null"}
CHAT_RUNTIME = vf.SubprocessConfig()
REWARD = "rl_llm_return"


class RLLMTaskData(vf.TaskData):
    """One episode: the env and the seed that fix its task; ``prompt`` and ``system_prompt`` are the env's
    opening conversation for that seed (what the model is shown first)."""

    env_id: str
    env_kwargs: dict[str, Any] = Field(default_factory=dict)
    seed: int
    options: dict[str, Any] = Field(default_factory=dict)
    task_id: str = ""


class RLLMTask(vf.Task[RLLMTaskData]):
    """No reward method: the env's return is recorded on the trace by :class:`RLLMEnv` as the episode runs."""


class RLLMTasksetConfig(vf.TasksetConfig):
    env_id: str = ""
    """The rl-llm env id (``rl-llm/<Name>-v0``, or ``social/<game>`` for one seat of a game); empty: the
    taskset's own (``RLLMTaskset.ENV_ID``, which a hub package sets)."""
    env_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments for the env, over the taskset's own ``ENV_KWARGS``
    (``--env.taskset.env-kwargs '{"opponent": "minimax"}'``)."""
    num_tasks: int = Field(64, ge=1)
    """How many tasks: seeds ``seed, seed + 1, ...``."""
    seed: int = 0
    options: dict[str, Any] = Field(default_factory=dict)
    """Reset options passed with every seed."""


class RLLMTaskset(vf.Taskset[RLLMTask, RLLMTasksetConfig]):
    """The env's tasks, one per seed; each task's prompt is the env's opening conversation for it. A hub
    package subclasses it with its own ``ENV_ID`` and ``ENV_KWARGS`` (see ``integrations/verifiers_hub.py``)."""

    ENV_ID: str = "rl-llm/TicTacToe-v0"
    ENV_KWARGS: Mapping[str, Any] = {}

    def load(self) -> Iterator[RLLMTask]:
        config = self.config
        env_id = config.env_id or self.ENV_ID
        env_kwargs = {**self.ENV_KWARGS, **config.env_kwargs}
        env = make_env(env_id, **env_kwargs)
        try:
            for seed in range(config.seed, config.seed + config.num_tasks):
                observation, info = env.reset(seed=seed, options=dict(config.options))
                data = RLLMTaskData(
                    name=f"{env_id}#{seed}", prompt=observation, system_prompt=info["system_prompt"],
                    env_id=env_id, env_kwargs=env_kwargs, seed=seed, options=dict(config.options),
                    task_id=str(info.get("task_id", "")),
                )  # fmt: skip
                yield RLLMTask(data, config.task)
        finally:
            env.close()


class RLLMEnvConfig(vf.EnvConfig):
    agent: vf.AgentConfig = vf.AgentConfig(harness=CHAT_HARNESS, runtime=CHAT_RUNTIME)
    """The policy's seat (``--env.agent.*``, as in verifiers' single-agent env)."""


class RLLMEnv(vf.Env[RLLMEnvConfig]):
    """One rl-llm episode per task: the env plays the user of the agent's interaction."""

    async def run(self, task: vf.Task, agents: vf.Agents) -> None:
        data = task.data
        env = make_env(data.env_id, **data.env_kwargs)
        try:
            observation, _ = await asyncio.to_thread(env.reset, seed=data.seed, options=dict(data.options))
            if observation != data.prompt:  # the contract: the same seed gives the same task
                raise vf.EnvError(f"{data.env_id} reset with seed {data.seed} no longer gives the task's prompt")
            total, turns, components, metrics = 0.0, 0, {}, {}
            async with agents.agent.interaction(task) as interaction:
                segment = await interaction.turn()  # the task's prompt opens the exchange
                while not segment.terminated:
                    action = _reply_text(segment)
                    observation, reward, terminated, truncated, info = await asyncio.to_thread(env.step, action)
                    total, turns = total + float(reward), turns + 1
                    for name, value in (info.get("reward_components") or {}).items():
                        components[name] = components.get(name, 0.0) + float(value)
                    metrics = info.get("metrics") or {}
                    if terminated or truncated:
                        interaction.trace.stop("env_done")
                        break
                    segment = await interaction.turn(observation)
                trace = interaction.trace
                trace.record_reward(REWARD, total)
                trace.record_metric("env_turns", turns)
                trace.record_metrics({f"reward_component/{k}": v for k, v in components.items()})
                trace.record_metrics({f"env/{k}": float(v) for k, v in metrics.items() if _is_number(v)})
        finally:
            await asyncio.to_thread(env.close)


class RLLMGameEnvConfig(vf.EnvConfig):
    player_0: vf.AgentConfig = vf.AgentConfig(harness=CHAT_HARNESS, runtime=CHAT_RUNTIME)
    player_1: vf.AgentConfig = vf.AgentConfig(harness=CHAT_HARNESS, runtime=CHAT_RUNTIME)


class RLLMGameEnv(vf.Env[RLLMGameEnvConfig]):
    """A two-player social game (``social/<game>`` tasks, no ``opponent``) with both seats played by agents,
    verifiers' multi-agent form: one interaction per seat, the game relaying between them. Each seat's trace
    gets its own payoff as ``rl_llm_return`` (docs/verifiers.md#two-player-games)."""

    async def run(self, task: vf.Task, agents: vf.Agents) -> None:
        from rl_llm.envs.social import load
        from rl_llm.integrations.social_seat import SEATS, SOCIAL_PREFIX

        data = task.data
        if not data.env_id.startswith(SOCIAL_PREFIX) or "opponent" in data.env_kwargs:
            raise vf.EnvError(f"RLLMGameEnv plays social/<game> with both seats as agents; got {data.env_id} "
                              f"with {sorted(data.env_kwargs)} (one seat against a baseline is RLLMEnv)")  # fmt: skip
        kwargs = {k: v for k, v in data.env_kwargs.items() if k not in ("seat", "opponent_seed")}
        game = load(data.env_id.removeprefix(SOCIAL_PREFIX)).parallel_env(**kwargs)
        try:
            observations, infos = await asyncio.to_thread(game.reset, seed=data.seed, options=dict(data.options))
            # Each seat opens its own exchange with its own system prompt and first observation.
            seat_tasks = {seat: task.with_data(prompt=None, system_prompt=infos[seat]["system_prompt"])
                          for seat in SEATS}  # fmt: skip
            pending = {seat: str(observations[seat]) for seat in SEATS}  # not yet shown to the seat
            active = {seat: bool(infos[seat].get("active")) for seat in SEATS}
            totals, turns = dict.fromkeys(SEATS, 0.0), dict.fromkeys(SEATS, 0)
            async with agents.player_0.interaction(seat_tasks["player_0"]) as first, \
                    agents.player_1.interaction(seat_tasks["player_1"]) as second:  # fmt: skip
                interactions = {"player_0": first, "player_1": second}
                game_over = cut = False
                while not (game_over or cut):
                    actions = {}
                    for seat in (seat for seat in SEATS if active[seat]):
                        segment = await interactions[seat].turn(pending[seat])
                        pending[seat] = ""
                        if segment.terminated:  # the seat's own limit ended its run: the game cannot go on
                            cut = True
                            break
                        actions[seat], turns[seat] = _reply_text(segment), turns[seat] + 1
                    if cut or not actions:
                        break
                    observations, rewards, terminations, truncations, infos = await asyncio.to_thread(game.step, actions)
                    for seat in SEATS:
                        totals[seat] += float(rewards[seat])
                        if observations[seat]:  # kept until the seat is asked again
                            pending[seat] = "\n\n".join(part for part in (pending[seat], str(observations[seat])) if part)
                        active[seat] = bool(infos[seat].get("active"))
                    game_over = all(terminations[seat] or truncations[seat] for seat in SEATS)
                for seat, interaction in interactions.items():
                    if game_over:
                        interaction.trace.stop("env_done")
                    interaction.trace.record_reward(REWARD, totals[seat])
                    interaction.trace.record_metric("env_turns", turns[seat])
        finally:
            await asyncio.to_thread(game.close)


def _reply_text(segment: Any) -> str:
    """The model's turn as generated: the last assistant message's text (``last_reply`` strips it)."""
    for message in reversed(segment.messages):
        if isinstance(message, vf.AssistantMessage):
            return message.content if isinstance(message.content, str) else content_text(message.content)
    return segment.last_reply


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
