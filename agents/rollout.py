"""The rollout engine: the one episode loop. N environments played concurrently by any agent, recorded as
``Trajectory`` records (token-in, token-out for LLM policies).

Entry point (stable; the trainer, evaluation, ``rl-llm bench``, SFT expert data and ``rl-llm play`` call it)::

    trajectories = collect(
        "rl-llm/TicTacToe-v0",          # an env id or a zero-argument factory returning a gym.Env
        policy,                          # any Policy: an LLMPolicy (hf, vllm, openai), a baseline, a person
        seeds=[0, 1, 2, 3],
        group_size=8,                    # G rollouts per seed: same task, same group_id (GRPO groups)
        env_kwargs={"opponent": "minimax"},
        max_new_tokens=128,              # per turn; default policy.sampling.max_new_tokens (LLMs)
        concurrency=32,                  # episodes in flight (one env instance each)
    )                                    # -> len(seeds) * group_size Trajectory records, seed-major order

Each episode is its own coroutine: it advances as soon as its own action is there, and env resets and steps
run on a thread pool, off the generation path. Two kinds of player:

- An ``LLMPolicy`` gets generation requests. Backends with their own continuous batching (vLLM's async engine
  or server, HTTP APIs) get each request the moment it exists; batch backends (``hf``, offline vLLM) go
  through ``BatchScheduler``, which sends whatever is waiting whenever the generator is free.
- Any other ``Policy`` (baselines, ``rl_llm.agents.human.Human``) makes one ``EpisodeAgent`` per episode
  (``policy.start_episode(EpisodeStart(env, info, seed, group_index))``, after the reset) and is asked
  ``await agent.aact(conversation)`` every turn; the agent keeps its episode's state, so nothing depends on
  which episodes run beside it. Its trajectory has the messages, turns, rewards and metrics and no tokens;
  with ``tokenizer=`` (SFT expert data) its actions are recorded token-in, token-out like a policy's, each
  action's tokens as POLICY tokens with log-prob 0.

Token-in, token-out (token backends): the chat template renders the first prompt once (PROMPT tokens);
then each turn appends the policy's tokens exactly as generated (POLICY tokens, with the generator's
log-probs) and the template delta that closes the turn and adds the observation as a user message (ENV
tokens). Nothing is re-tokenised, so ``trajectory.token_ids`` is exactly what the generator conditioned
on and produced; ``turn.token_start:turn.token_end`` are the policy tokens of each turn, and
``policy.decode(those tokens) == turn.action``, the text the env received. Chat-only backends (``openai``)
give trajectories with messages and turns but no tokens.

Partial rollouts (APRIL): ``RolloutEngine.run(jobs, until=...)`` pauses every unfinished episode between
two turns once ``until(finished)`` holds, and returns it as a ``PausedEpisode`` (its env, still open, and
the trajectory so far); a later run given ``EpisodeJob(resume=paused)`` continues it, possibly with newer
weights: each turn keeps the policy version that produced it.

A failed generation, agent or env call ends that episode with ``end_reason="error"`` and the reason in
``trajectory.error`` (so does an env call whose result cannot be recorded, such as a NaN reward:
``env_output.py``); every other episode goes on and every requested trajectory is returned. (An env that
cannot be built at all, or an ``on_trajectory`` callback that raises, stops the whole run.)
``write_trajectories`` / ``read_trajectories`` store them as JSONL (one record per line, with
``schema_version``).

Two-player games (``env="social/<game>"``, a game of ``rl_llm.envs.social`` through its PettingZoo parallel
API; docs/multi-agent.md). Everything an episode keeps per player is one ``_Seat``: its recorder (its own
``Trajectory``), the stop strings its env info names, and its ``EpisodeAgent`` (None for the engine's LLM
policy, which gets generation requests); ``_act(seat, job)`` is the one way a seat's next action is obtained,
for either kind. A game episode is one env and one seat per player, each seat from its own policy
(``EpisodeJob.players``, None: the engine's policy; ``EpisodeStart.seat`` names the player, so one policy can
hold both seats): the coroutine asks the seats the game marks active at once (``asyncio.gather``), steps the
env, and records each seat's reward and new observation in that seat's trajectory. A seat's observations
while it is not asked are merged into its next user message; a reward it gets on a step it did not act in
(a loss on the other player's winning move) is added to its last turn. Each turn records the game round it
played in (``turn.info["round"]``) for per-round credit. LLM seats of all matches share the scheduler, so
their requests are batched across matches and seats as single-agent episodes' are. ``collect_games`` plays
matches and returns one tuple of trajectories (one per seat) per match; an ``action_template`` wraps the
text of the seats the engine's own policy plays (and of any other ``LLMPolicy`` seat, e.g. a past copy of
the policy), as ``ActionTemplate`` does for a single-agent env.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import gymnasium as gym

from rl_llm.agents.aio import run_sync
from rl_llm.agents.batching import BatchScheduler, BatchStats
from rl_llm.agents.env_output import game_problem, reset_problem, step_problem, token_problem
from rl_llm.agents.http_client import ContextLengthExceeded
from rl_llm.agents.llm import GenerationRequest, LLMPolicy
from rl_llm.agents.policy import Completion, EpisodeAgent, EpisodeStart, Policy, as_completion
from rl_llm.checks import integer, seconds, seed_list
from rl_llm.envs.registration import arguments_error
from rl_llm.types import Message, TokenRole, Trajectory, Turn

#: Anything that builds a fresh env (``rl_llm.envs.EnvFactory`` is the picklable one).
MakeEnv = Callable[[], gym.Env]


@dataclass(frozen=True)
class EpisodeJob:
    seed: int | None
    group_index: int = 0
    options: dict[str, Any] | None = None
    resume: PausedEpisode | None = None  # continue this paused episode instead of resetting an env
    # A two-player game: who plays each seat (player_0, player_1); None (or a None entry) is the engine's policy.
    players: tuple[Policy | None, ...] | None = None


@dataclass(frozen=True)
class PausedEpisode:
    """An episode stopped between two turns (partial rollouts): its env is open and owned by this record
    until a run resumes it or ``close()`` releases it."""

    job: EpisodeJob
    env: gym.Env
    seat: _Seat

    @property
    def trajectory(self) -> Trajectory:
        return self.seat.record.trajectory

    def close(self) -> None:
        self.env.close()


@dataclass
class RolloutStats:
    policy_tokens: int = 0
    batches: BatchStats = field(default_factory=BatchStats)


def collect(
    env: str | MakeEnv,
    policy: Policy,
    seeds: Sequence[int | None],
    group_size: int = 1,
    *,
    env_kwargs: dict[str, Any] | None = None,
    reset_options: dict[str, Any] | None = None,
    max_new_tokens: int | None = None,
    concurrency: int = 32,
    on_trajectory: Callable[[Trajectory], None] | None = None,
    **engine_options: Any,
) -> list[Trajectory]:
    """Play ``group_size`` episodes per seed and return their trajectories (seed-major, then group index).

    ``engine_options`` go to ``RolloutEngine`` (``env_workers``, ``max_batch_size``, ``gather_timeout_s``,
    ``max_context_tokens``, ``tokenizer``). ``on_trajectory`` is called (on the engine's event-loop thread) as
    each episode ends.
    """
    seeds, group_size = seed_list(seeds, allow_none=True), integer("group_size", group_size, minimum=1)
    engine = RolloutEngine(
        policy, env, env_kwargs=env_kwargs, max_new_tokens=max_new_tokens, concurrency=concurrency, **engine_options
    )
    jobs = [
        EpisodeJob(seed=seed, group_index=g, options=reset_options)
        for i, seed in enumerate(seeds)
        for g in range(group_size)
    ]
    return engine.run(jobs, on_trajectory)


GAME_PREFIX = "social/"
MAX_GAME_STEPS = 10_000  # a game that has not ended after this many env steps is truncated
MAX_EPISODE_STEPS = 100_000  # a single-agent episode past this many steps is an error (no turn limit)


def collect_games(
    game: str,
    policy: Policy,
    seeds: Sequence[int | None],
    group_size: int = 1,
    *,
    players: Callable[[int | None, int], tuple[Policy | None, ...]] | None = None,
    env_kwargs: dict[str, Any] | None = None,
    max_new_tokens: int | None = None,
    concurrency: int = 32,
    **engine_options: Any,
) -> list[tuple[Trajectory, ...]]:
    """Play ``group_size`` matches of ``game`` (``"social/prisoners_dilemma_v0"`` or the bare module name) per
    seed; one tuple of trajectories per match (one per seat), seed-major. ``players(seed, group_index)`` names
    who plays each seat (None: ``policy``); by default ``policy`` plays both (self-play)."""
    if not isinstance(game, str):
        raise ValueError(f"game must be a game's name such as 'prisoners_dilemma_v0', got {game!r}")
    seeds, group_size = seed_list(seeds, allow_none=True), integer("group_size", group_size, minimum=1)
    env_id = game if game.startswith(GAME_PREFIX) else GAME_PREFIX + game
    engine = RolloutEngine(
        policy, env_id, env_kwargs=env_kwargs, max_new_tokens=max_new_tokens, concurrency=concurrency, **engine_options
    )
    jobs = [
        EpisodeJob(seed=seed, group_index=g, players=players(seed, g) if players is not None else None)
        for seed in seeds
        for g in range(group_size)
    ]
    return engine.run(jobs)


class RolloutEngine:
    def __init__(
        self,
        policy: Policy,
        env: str | MakeEnv,
        *,
        env_kwargs: dict[str, Any] | None = None,
        max_new_tokens: int | None = None,
        concurrency: int = 32,
        env_workers: int | None = None,
        max_batch_size: int | None = None,
        gather_timeout_s: float | None = None,
        max_context_tokens: int | None = None,
        tokenizer: Any = None,
        action_template: str | None = None,
    ) -> None:
        """``tokenizer``: record a non-LLM agent's episodes token-in, token-out with this tokenizer's chat
        template (expert data for SFT); an LLM policy's own tokenizer is always used for its episodes.
        ``action_template`` (two-player games): the text the engine's policy (and any other ``LLMPolicy`` seat)
        writes goes into its ``{}``."""
        if not isinstance(policy, Policy):
            raise TypeError(f"the rollout engine plays a Policy, got {type(policy).__name__}")
        # Checked here, not where they are used: a NaN concurrency made a semaphore no episode ever passed (a
        # hang), a float or 0 limit reached a thread pool or a slice mid-run, and 0 meant "the default".
        concurrency = integer("concurrency", concurrency, minimum=1)
        max_new_tokens, env_workers, max_batch_size, max_context_tokens = (
            None if value is None else integer(name, value, minimum=1)
            for name, value in (("max_new_tokens", max_new_tokens), ("env_workers", env_workers),
                                ("max_batch_size", max_batch_size), ("max_context_tokens", max_context_tokens))
        )  # fmt: skip
        if gather_timeout_s is not None:  # 0: send each batch at once
            gather_timeout_s = seconds("gather_timeout_s", gather_timeout_s, allow_zero=True)
        self.policy = policy
        self.llm: LLMPolicy | None = policy if isinstance(policy, LLMPolicy) else None
        if self.llm is not None and tokenizer is not None:
            raise ValueError("tokenizer= is for agents without one; an LLM policy records with its own")
        self.tokenizer = tokenizer
        self.game: str | None = None
        self.action_template = action_template
        self.env_kwargs: dict[str, Any] = dict(env_kwargs or {})  # named in the error of an env it cannot build
        if isinstance(env, str) and env.startswith(GAME_PREFIX):
            from rl_llm.envs.social import load

            self.env_id, self.game = env, env.removeprefix(GAME_PREFIX)
            module = load(self.game)
            self.make_env = functools.partial(module.parallel_env, **(env_kwargs or {}))
        elif isinstance(env, str):
            import rl_llm  # noqa: F401  (registers the environments)

            self.env_id = env
            self.make_env: MakeEnv = functools.partial(gym.make, env, **(env_kwargs or {}))
        else:
            if env_kwargs:
                raise ValueError("env_kwargs apply to an env id; bind them into the factory instead")
            self.env_id, self.make_env = "", env
        default_tokens = self.llm.sampling.max_new_tokens if self.llm is not None else 1 << 30
        self.max_new_tokens = max_new_tokens or default_tokens
        self.concurrency = concurrency
        self.env_workers = env_workers or min(concurrency, 32)
        self.max_batch_size = max_batch_size or getattr(policy, "max_batch_size", 64)
        self.gather_timeout_s = gather_timeout_s
        self.max_context_tokens = max_context_tokens or _context_limit(policy)
        self.stats = RolloutStats()

    def run(
        self,
        jobs: Sequence[EpisodeJob],
        on_trajectory: Callable[[Trajectory], None] | None = None,
        until: Callable[[list[Trajectory]], bool] | None = None,
    ) -> list[Any]:
        """One result per job, in order: a ``Trajectory``, or (only with ``until``) a ``PausedEpisode``; in a
        two-player game a tuple of trajectories, one per seat.

        ``until(finished_so_far)`` is checked as each episode ends; once it holds, the episodes still running
        stop before their next action and come back paused (partial rollouts).
        """
        return run_sync(self.arun(jobs, on_trajectory, until))

    async def arun(
        self,
        jobs: Sequence[EpisodeJob],
        on_trajectory: Callable[[Trajectory], None] | None = None,
        until: Callable[[list[Trajectory]], bool] | None = None,
    ) -> list[Any]:
        if self.game is not None and until is not None:
            raise ValueError("partial rollouts (until=) are not supported for two-player games")
        self._on_trajectory = on_trajectory
        self._until = until
        self._finished: list[Trajectory] = []
        self._pausing = False
        self._slots = asyncio.Semaphore(self.concurrency)
        self._idle_envs: list[gym.Env] = []
        self._all_envs: list[gym.Env] = []
        self._live = 0
        self._chat_format = self._recording_format()
        self._env_pool = ThreadPoolExecutor(self.env_workers, thread_name_prefix="rl-llm-env")
        self._scheduler: BatchScheduler | None = None
        scheduler_task = None
        if self.llm is not None and not self.llm.concurrent:
            self._scheduler = BatchScheduler(
                self.llm.generate, lambda: self._live, self.llm.generation_thread(), self.max_batch_size,
                self.gather_timeout_s,
            )
            self._scheduler.stats = self.stats.batches  # accumulates over runs, like the other stats
            scheduler_task = asyncio.ensure_future(self._scheduler.run())
        episodes = [asyncio.ensure_future(self._episode(job)) for job in jobs]
        try:
            trajectories = await asyncio.gather(*episodes)
        finally:
            # When one episode raises (an env that cannot be built, a failing on_trajectory), gather does not
            # stop the others: cancel them and wait, so none outlives the scheduler and the envs it uses.
            for episode in episodes:
                episode.cancel()
            await asyncio.gather(*episodes, return_exceptions=True)
            if scheduler_task is not None:
                scheduler_task.cancel()
                await asyncio.gather(scheduler_task, return_exceptions=True)
            await self._close_envs()
            self._env_pool.shutdown(wait=False)
        played = [t for result in trajectories for t in (result if isinstance(result, tuple) else (result,))]
        self.stats.policy_tokens += sum(t.num_policy_tokens for t in played if isinstance(t, Trajectory))
        return list(trajectories)

    def _recording_format(self) -> Any:
        """The ChatFormat that episodes are tokenized with (None: messages only)."""
        if self.llm is not None:
            return self.llm.chat_format if self.llm.tokenizer is not None else None
        if self.tokenizer is None:
            return None
        from rl_llm.agents.chat import ChatFormat

        return ChatFormat(self.tokenizer)

    # -- one episode ------------------------------------------------------------------------------------
    async def _episode(self, job: EpisodeJob) -> Trajectory | PausedEpisode:
        async with self._slots:
            if job.resume is not None:
                env = job.resume.env
                self._all_envs.append(env)
            else:
                env = self._idle_envs.pop() if self._idle_envs else await self._new_env()
            self._live += 1
            healthy = False
            # Set before the try: when _play raises (cancelled by Ctrl-C or by a failing sibling episode), the
            # finally below must not hide that error behind an UnboundLocalError.
            trajectory: Trajectory | PausedEpisode | tuple | None = None
            try:
                trajectory, healthy = await self._play(env, job)
            finally:
                self._live -= 1
                if self._scheduler is not None:
                    self._scheduler.notify()
                if isinstance(trajectory, PausedEpisode):
                    self._all_envs.remove(env)  # the paused episode owns it now: not closed with this run
                elif healthy:
                    self._idle_envs.append(env)
        if isinstance(trajectory, PausedEpisode):
            return trajectory
        for played in trajectory if isinstance(trajectory, tuple) else (trajectory,):
            if self._on_trajectory is not None:
                self._on_trajectory(played)
            self._finished.append(played)
        if self._until is not None and not self._pausing and self._until(self._finished):
            self._pausing = True
        return trajectory

    async def _play(self, env: gym.Env, job: EpisodeJob) -> tuple[Trajectory | PausedEpisode, bool]:
        """Play (or resume) one episode; the flag says whether the env is fit for reuse (no exception escaped
        it). With partial rollouts the result may be a ``PausedEpisode``, taken between two turns."""
        if self.game is not None:
            return await self._play_game(env, job)
        if job.resume is not None:
            seat = job.resume.seat
        else:
            policy = self.policy
            record = _Recorder(Trajectory(
                env_id=self.env_id or _env_id(env), task_id="", seed=job.seed, group_index=job.group_index,
                policy_version=getattr(policy, "policy_version", 0),
                temperature=getattr(policy, "logprob_temperature", 1.0),
            ), self._chat_format)  # fmt: skip
            try:
                observation, info = await self._in_env_thread(env.reset, seed=job.seed, options=job.options)
            except Exception as error:
                return record.fail(f"env.reset failed: {type(error).__name__}: {error}"), False
            if (problem := reset_problem(observation, info)) is not None:
                return record.fail(f"env.reset returned {problem}"), False
            record.start(info, observation, job)
            seat = _Seat(record, tuple(info.get("stop", ())))
            if self.llm is None:
                start = EpisodeStart(env, info, seed=job.seed, group_index=job.group_index)
                try:
                    seat.agent = await self._in_env_thread(policy.start_episode, start)
                except Exception as error:
                    return record.fail(f"agent failed: {type(error).__name__}: {error}"), True
        result, healthy = await self._turns(env, job, seat)
        if isinstance(result, Trajectory):
            _end_agent(seat, result)
        return result, healthy

    async def _turns(self, env: gym.Env, job: EpisodeJob, seat: _Seat) -> tuple[Trajectory | PausedEpisode, bool]:
        record = seat.record
        actor = "agent" if seat.agent is not None else "generation"
        while True:
            if self._pausing:
                return PausedEpisode(replace(job, resume=None), env, seat), True
            if len(record.trajectory.turns) >= MAX_EPISODE_STEPS:  # an env with no turn limit ran on forever
                return record.fail(f"the env did not end the episode within {MAX_EPISODE_STEPS:,} steps; give it a "
                                   "turn limit (max_turns)"), False  # fmt: skip
            try:
                completion = await self._act(seat, job)
            except ContextLengthExceeded:  # a chat-only server counted the tokens for us: the episode is full
                return record.end("context_limit"), True
            except Exception as error:
                return record.fail(f"{actor} failed: {type(error).__name__}: {error}"), True
            if completion is None:
                return record.end("context_limit"), True
            try:
                observation, reward, terminated, truncated, info = await self._in_env_thread(env.step, completion.text)
            except Exception as error:
                return record.fail(f"env.step failed: {type(error).__name__}: {error}"), False
            if (problem := step_problem(observation, reward, info, terminated, truncated)) is not None:
                return record.fail(f"env.step returned {problem}"), False
            record.add_step(completion, observation, reward, info)
            if terminated or truncated:
                record.trajectory.terminated, record.trajectory.truncated = bool(terminated), bool(truncated)
                return record.end("terminated" if terminated else "truncated"), True
            if not record.add_observation(observation, completion, self.max_context_tokens):
                return record.end("context_limit"), True

    async def _act(self, seat: _Seat, job: EpisodeJob) -> Completion | None:
        """The seat's next action, recorded in its trajectory; None when its token record has no room left."""
        record = seat.record
        trajectory = record.trajectory
        budget = min(self.max_new_tokens, self.max_context_tokens - len(trajectory.token_ids))
        if record.tokenized and budget < 1:
            return None
        if seat.agent is None:  # the engine's LLM policy
            request = GenerationRequest(
                messages=list(trajectory.messages),
                prompt_ids=list(trajectory.token_ids) if record.tokenized else None,
                stop=seat.stop,
                max_new_tokens=budget,
                # Names the draw, so seeded backends sample it the same whatever the batch (agents/hf.py).
                metadata={"seed": job.seed, "group_index": job.group_index, "turn": len(trajectory.turns),
                          **({"seat": trajectory.seat} if trajectory.seat else {})},
            )
            completion = await self._generate(request)
        else:
            completion = as_completion(await seat.agent.aact(list(trajectory.messages)))
            if record.tokenized and completion.token_ids is None:  # an expert's text, as the model's tokens
                token_ids = record.chat_format.encode(completion.text)
                completion = replace(completion, token_ids=token_ids, logprobs=[0.0] * len(token_ids),
                                     finish_reason=completion.finish_reason or "stop")  # fmt: skip
        version = completion.policy_version
        record.add_completion(completion, getattr(self.policy, "policy_version", 0) if version is None else version)
        return completion

    # -- one match of a two-player game ------------------------------------------------------------------
    async def _play_game(self, env: Any, job: EpisodeJob) -> tuple[tuple[Trajectory, ...], bool]:
        """Play one match; one trajectory per seat (in ``env.possible_agents`` order) and whether the env may
        be reused. Each seat's ``EpisodeAgent`` is told the match is over (``end``), as in a single-agent episode."""
        seats: list[_Seat] = []
        results, healthy = await self._play_match(env, job, seats)
        for seat, result in zip(seats, results, strict=False):
            _end_agent(seat, result)
        return results, healthy

    async def _play_match(self, env: Any, job: EpisodeJob, seats: list[_Seat]) -> tuple[tuple[Trajectory, ...], bool]:
        """``_play_game``'s match, filling ``seats`` (one per player) as it makes them."""
        names = list(env.possible_agents)
        players = list(job.players or ())
        players += [None] * (len(names) - len(players))
        if len(players) != len(names):
            raise ValueError(f"{self.game} has {len(names)} seats, got {len(players)} players")
        players = [self.policy if player is None else player for player in players]

        def label(index: int) -> str:  # who played the other seat: "self" in self-play, "policy", a baseline
            other = players[1 - index]
            if other is self.policy:
                return "self" if players[index] is self.policy else "policy"
            return str(getattr(other, "name", type(other).__name__))

        for index, (name, player) in enumerate(zip(names, players, strict=True)):
            trajectory = Trajectory(
                env_id=self.env_id, task_id="", seed=job.seed, group_index=job.group_index, seat=name,
                opponent=label(index), policy_version=getattr(player, "policy_version", 0) if player is self.policy else 0,
                temperature=getattr(player, "logprob_temperature", 1.0),
            )  # fmt: skip
            seats.append(_Seat(_Recorder(trajectory, self._chat_format if player is self.policy else None)))
        records = [seat.record for seat in seats]

        def fail(error: str, healthy: bool) -> tuple[tuple[Trajectory, ...], bool]:
            return tuple(record.fail(error) for record in records), healthy

        try:
            observations, infos = await self._in_env_thread(env.reset, seed=job.seed, options=job.options)
        except Exception as error:
            return fail(f"env.reset failed: {type(error).__name__}: {error}", False)
        if (problem := game_problem(names, observations, infos)) is not None:
            return fail(f"env.reset returned {problem}", False)
        for name, seat, player in zip(names, seats, players, strict=True):
            info = dict(infos[name])
            seat.record.start(info, str(observations[name]), job)
            seat.stop = tuple(info.get("stop", ()))
            if not (player is self.llm and self.llm is not None):
                start = EpisodeStart(env, info, seed=job.seed, group_index=job.group_index, seat=name)
                try:
                    seat.agent = await self._in_env_thread(player.start_episode, start)
                except Exception as error:
                    return fail(f"agent failed ({name}): {type(error).__name__}: {error}", True)
        pending: dict[str, list[str]] = {name: [] for name in names}  # observations not yet in the record
        carried = dict.fromkeys(names, 0.0)  # rewards that arrived before the seat's first turn
        last: dict[str, Completion | None] = dict.fromkeys(names)
        moves = dict.fromkeys(names, 0)
        for _ in range(MAX_GAME_STEPS):
            active = [i for i, name in enumerate(names) if infos[name].get("active", True)]
            if not active:
                return fail(f"{self.game}: no player is active but the game has not ended", False)
            for i in active:  # the seat's news since its last action becomes its next user message
                name = names[i]
                if last[name] is not None and pending[name]:
                    text = "\n\n".join(pending[name])
                    if not records[i].add_observation(text, last[name], self.max_context_tokens):
                        return tuple(record.end("context_limit") for record in records), True
                pending[name] = []
            try:
                completions = await asyncio.gather(*(self._act(seats[i], job) for i in active))
            except Exception as error:
                return fail(f"generation or agent failed: {type(error).__name__}: {error}", True)
            if any(completion is None for completion in completions):
                return tuple(record.end("context_limit") for record in records), True
            actions = {}
            for i, completion in zip(active, completions, strict=True):
                text = completion.text
                # Every LLM seat (a past copy of the policy too) was prompted the same way: the template wraps it.
                if self.action_template and (players[i] is self.policy or isinstance(players[i], LLMPolicy)):
                    text = self.action_template.replace("{}", text, 1)
                actions[names[i]] = text
            rounds = {names[i]: infos[names[i]].get("round", moves[names[i]] + 1) for i in active}
            try:
                observations, rewards, terminations, truncations, infos = await self._in_env_thread(env.step, actions)
            except Exception as error:
                return fail(f"env.step failed: {type(error).__name__}: {error}", False)
            if (problem := game_problem(names, observations, infos, rewards, terminations, truncations)) is not None:
                return fail(f"env.step returned {problem}", False)
            for i, name in enumerate(names):
                reward, info, observation = float(rewards.get(name, 0.0)), infos[name], str(observations[name])
                record = records[i]
                if i in active:
                    completion = completions[active.index(i)]
                    record.add_step(completion, observation, reward + carried[name], info)
                    record.trajectory.turns[-1].info["round"] = int(rounds[name])
                    carried[name], last[name] = 0.0, completion
                    moves[name] += not bool(info.get("invalid_action", False))
                else:
                    if record.trajectory.turns:
                        record.trajectory.turns[-1].reward += reward
                    else:
                        carried[name] += reward
                    record.trajectory.metrics = {k: float(v) for k, v in info.get("metrics", {}).items()}
                if observation:
                    pending[name].append(observation)
            if all(terminations.get(n, False) or truncations.get(n, False) for n in names):
                results = []
                for name, record in zip(names, records, strict=True):
                    terminated = bool(terminations.get(name, False))
                    record.trajectory.terminated, record.trajectory.truncated = terminated, not terminated
                    results.append(record.end("terminated" if terminated else "truncated"))
                return tuple(results), True
        for record in records:
            record.trajectory.truncated = True
        return tuple(record.end("truncated") for record in records), True

    async def _generate(self, request: GenerationRequest) -> Completion:
        if self._scheduler is not None:
            return await self._scheduler.submit(request)
        return await self.llm.agenerate(request)

    async def _in_env_thread(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        call = functools.partial(function, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._env_pool, call)

    async def _new_env(self) -> gym.Env:
        try:
            env = await self._in_env_thread(self.make_env)
        except TypeError as error:
            if not self.env_id:  # a factory of the caller's: its own bug or its own arguments
                raise
            raise arguments_error(self.env_id, self.env_kwargs, error) from error
        self._all_envs.append(env)
        return env

    async def _close_envs(self) -> None:
        # Closing is best effort (the results are already recorded), and concurrent: sandboxes take a while.
        await asyncio.gather(*(self._in_env_thread(env.close) for env in self._all_envs), return_exceptions=True)


class _Recorder:
    """Builds one trajectory: messages, turns, and (with a chat format) tokens with roles and log-probs."""

    def __init__(self, trajectory: Trajectory, chat_format: Any = None) -> None:
        self.trajectory = trajectory
        self.chat_format = chat_format
        self.tokenized = chat_format is not None

    def _add_tokens(self, token_ids: Sequence[int], role: TokenRole, logprobs: Sequence[float] | None = None) -> None:
        trajectory = self.trajectory
        trajectory.token_ids += token_ids
        trajectory.token_roles += [int(role)] * len(token_ids)
        trajectory.logprobs += list(logprobs) if logprobs is not None else [0.0] * len(token_ids)

    def start(self, info: dict[str, Any], observation: str, job: EpisodeJob) -> None:
        trajectory = self.trajectory
        trajectory.task_id = str(info.get("task_id", ""))
        trajectory.group_id = f"{trajectory.task_id}|seed={job.seed}"
        # An env may name its state (info["state_key"]): each turn records the state it started from, the anchor
        # of GiGPO's step groups (docs/training.md#turn-level-credit).
        self._state_key = info.get("state_key")
        system = info.get("system_prompt", "")
        trajectory.messages = ([Message("system", system)] if system else []) + [Message("user", observation)]
        if self.tokenized:
            self._add_tokens(self.chat_format.prompt_ids(trajectory.messages), TokenRole.PROMPT)

    def add_completion(self, completion: Completion, policy_version: int) -> None:
        if not isinstance(completion.text, str):  # None reached env.step, 123 the trajectory file
            raise TypeError(f"a completion's text must be a str, got {type(completion.text).__name__}")
        self._turn_start = len(self.trajectory.token_ids)
        if self.tokenized:
            if completion.token_ids is None or completion.logprobs is None:
                raise RuntimeError("a token backend returned a completion without token ids or log-probs")
            if (problem := token_problem(completion.token_ids, completion.logprobs)) is not None:
                raise ValueError(f"a token backend returned {problem}")
            self._add_tokens(completion.token_ids, TokenRole.POLICY, completion.logprobs)
        self.trajectory.messages.append(Message("assistant", completion.text))
        self._policy_version = policy_version

    def add_step(self, completion: Completion, observation: str, reward: float, info: dict[str, Any]) -> None:
        metrics = {name: float(value) for name, value in info.get("metrics", {}).items()}
        self.trajectory.turns.append(Turn(
            action=completion.text, observation=observation, reward=float(reward),
            invalid_action=bool(info.get("invalid_action", False)),
            token_start=self._turn_start, token_end=len(self.trajectory.token_ids),
            info={
                "reward_components": {k: float(v) for k, v in info.get("reward_components", {}).items()},
                "metrics": metrics, "finish_reason": completion.finish_reason, "policy_version": self._policy_version,
            },
        ))  # fmt: skip
        if getattr(self, "_state_key", None) is not None:
            self.trajectory.turns[-1].info["state_key"] = str(self._state_key)
        self._state_key = info.get("state_key")
        self.trajectory.metrics = metrics

    def add_observation(self, observation: str, completion: Completion, limit: int) -> bool:
        """Append the observation; False (and nothing appended) when it would leave no room to generate."""
        if self.tokenized:
            token_ids = self.chat_format.observation_ids(observation, completion.token_ids or [])
            if len(self.trajectory.token_ids) + len(token_ids) >= limit:
                return False
            self._add_tokens(token_ids, TokenRole.ENV)
        self.trajectory.messages.append(Message("user", observation))
        return True

    def end(self, reason: str) -> Trajectory:
        self.trajectory.end_reason = reason
        if reason == "context_limit":
            self.trajectory.truncated = True
        return self.trajectory

    def fail(self, error: str) -> Trajectory:
        self.trajectory.error = error
        self.trajectory.truncated = True
        return self.end("error")


@dataclass
class _Seat:
    """One player's side of an episode: its recorder (its trajectory), the stop strings its env info names,
    and who answers: its ``EpisodeAgent``, or None for the engine's LLM policy (generation requests)."""

    record: _Recorder
    stop: tuple[str, ...] = ()
    agent: EpisodeAgent | None = None


def _env_id(env: gym.Env) -> str:
    spec = getattr(env, "spec", None)
    return spec.id if spec is not None else type(env.unwrapped).__name__


def _context_limit(policy: LLMPolicy) -> int:
    for owner in (getattr(getattr(policy, "model", None), "config", None), policy):
        limit = getattr(owner, "max_position_embeddings", None) or getattr(owner, "max_context_tokens", None)
        if limit:
            return int(limit)
    return 1 << 30


def write_trajectories(trajectories: Iterable[Trajectory], path: str | Path) -> Path:
    """Write trajectories as JSONL (each line carries ``schema_version``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for trajectory in trajectories:
            handle.write(trajectory.to_json() + "\n")
    return path


def read_trajectories(path: str | Path) -> list[Trajectory]:
    with Path(path).open(encoding="utf-8") as handle:
        return [Trajectory.from_json(line) for line in handle if line.strip()]


def _end_agent(seat: _Seat, result: Trajectory) -> None:
    """Tell the seat's agent its episode is over; its failure is the episode's, recorded like any other agent
    call's (it raised out of the whole rollout before, and every episode was lost)."""
    if seat.agent is None:
        return
    try:
        seat.agent.end(result)
    except Exception as error:
        if result.error is None:
            result.error = f"agent.end failed: {type(error).__name__}: {error}"
            result.truncated, result.end_reason = True, "error"

