"""Round-robin tournaments between agents on a two-player game of ``rl_llm.envs.social``.

Every ordered pair of agents plays one match per seed (so both seat orders; an agent against itself plays
once per seed), all seeds of a pairing at once: each seat of each match is its own ``EpisodeAgent``, and
each step an LLM policy gets one generation batch with the conversations of all matches waiting on it. Games are driven through PettingZoo's AEC API, so the same
loop plays the parallel games (converted) and native turn-based ones; agents whose info says
``active: False`` are not asked (their empty action is ignored by the game).

Reported per agent: mean return, cooperation rate, collective welfare (sum of both players' returns) of its
matches, and exploitability: the largest mean head-to-head margin ``return(Y) - return(agent)`` that any
exploiter baseline ``Y`` (by default every baseline of the game, the agent itself included) achieves against
it, over both seat orders and all seeds.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from rl_llm.agents.baselines import make_baseline
from rl_llm.agents.baselines.social import SOCIAL_BASELINES
from rl_llm.agents.evaluate import mean_ci95
from rl_llm.agents.llm import LLMEpisode, LLMPolicy
from rl_llm.agents.policy import Completion, EpisodeAgent, EpisodeStart, Policy, as_completion
from rl_llm.checks import seed_list
from rl_llm.envs.registration import arguments_error
from rl_llm.envs.social import load
from rl_llm.envs.social.base import AGENTS
from rl_llm.types import Message


@dataclass
class MatchRecord:
    """One game. Tuples are indexed by seat (``player_0``, ``player_1``)."""

    game: str
    seed: int
    task_id: str
    agents: tuple[str, str]
    returns: tuple[float, float]
    cooperation: tuple[float, float]  # NaN where the game has no cooperation metric
    invalid_actions: tuple[int, int]
    steps: int
    transcript: str | None = None

    @property
    def welfare(self) -> float:
        return self.returns[0] + self.returns[1]


@dataclass
class Standing:
    agent: str
    matches: int
    mean_return: float
    return_ci95: float
    cooperation_rate: float
    welfare: float
    exploitability: float
    exploiter: str
    invalid_actions: float


@dataclass
class TournamentResult:
    game: str
    agents: list[str]
    seeds: list[int]
    matches: list[MatchRecord]  # round robin between ``agents``
    exploiter_matches: list[MatchRecord]  # extra matches against exploiters that are not entrants
    standings: dict[str, Standing] = field(default_factory=dict)

    def head_to_head(self, a: str, b: str) -> tuple[float, float]:
        """Mean returns of ``a`` and ``b`` in their matches, over both seat orders and every seed."""
        mine, theirs = [], []
        for match in self.matches + self.exploiter_matches:
            for seat in (0, 1):
                if match.agents[seat] == a and match.agents[1 - seat] == b:
                    mine.append(match.returns[seat])
                    theirs.append(match.returns[1 - seat])
        if not mine:
            raise KeyError(f"{a} and {b} did not play each other")
        return sum(mine) / len(mine), sum(theirs) / len(theirs)

    def welfare(self, a: str, b: str) -> float:
        """Mean collective welfare of the matches between ``a`` and ``b``."""
        mine, theirs = self.head_to_head(a, b)
        return mine + theirs


def _seed_for(*parts: object) -> int:
    """A stable seed from names (``hash()`` of a str changes between processes)."""
    return zlib.crc32("|".join(map(str, parts)).encode())


def _add_observation(conversation: list[Message], observation: str) -> None:
    """Append an observation; consecutive observations (the agent was not asked in between) are merged."""
    if not observation:
        return
    if conversation and conversation[-1].role == "user":
        conversation[-1] = Message("user", f"{conversation[-1].content}\n\n{observation}")
    else:
        conversation.append(Message("user", observation))


def play_matches(
    game: str,
    seats: tuple[Policy, Policy],
    seeds: Sequence[int],
    names: tuple[str, str] = ("player_0", "player_1"),
    env_kwargs: Mapping[str, Any] | None = None,
    keep_transcripts: bool = False,
) -> list[MatchRecord]:
    """One match per seed between ``seats[0]`` (as ``player_0``) and ``seats[1]``, played concurrently.

    Each seat of each match is its own ``EpisodeAgent`` (``policy.start_episode``, with ``EpisodeStart.seat``
    naming the player), so a stateful agent never depends on the order of the matches; an LLM policy answers
    the requests of all matches waiting on it as one batch.
    """
    seeds = seed_list(seeds, allow_none=True)  # numpy refused a negative seed inside the first env.reset
    module = load(game)
    try:
        envs = [module.env(**dict(env_kwargs or {})) for _ in seeds]
    except TypeError as error:  # `-k num_rounds=abc`: the game's arguments, in one line rather than a traceback
        raise arguments_error(game, dict(env_kwargs or {}), error) from error
    conversations: list[dict[str, list[Message]]] = []
    players: list[dict[str, EpisodeAgent]] = []
    for env, seed in zip(envs, seeds, strict=True):
        env.reset(seed=seed)
        conversations.append({agent: [Message("system", env.infos[agent]["system_prompt"])] for agent in AGENTS})
        players.append({
            agent: seats[index].start_episode(EpisodeStart(env, dict(env.infos[agent]), seed=seed, seat=agent))
            for index, agent in enumerate(AGENTS)
        })  # fmt: skip
    returns = [dict.fromkeys(AGENTS, 0.0) for _ in envs]
    final_info: list[dict[str, dict]] = [{} for _ in envs]
    steps = [0] * len(envs)
    live = list(range(len(envs)))
    while live:
        waiting: dict[int, list[tuple[int, str]]] = {}  # id(policy) -> (match, agent) asking it to act
        for m in live:
            env = envs[m]
            agent = env.agent_selection
            observation, reward, terminated, truncated, info = env.last()
            returns[m][agent] += float(reward)
            if terminated or truncated:
                final_info[m][agent] = info
                env.step(None)
            elif info.get("active", True):
                _add_observation(conversations[m][agent], observation)
                waiting.setdefault(id(seats[AGENTS.index(agent)]), []).append((m, agent))
            else:
                _add_observation(conversations[m][agent], observation)
                env.step("")
        for requests in waiting.values():
            policy = seats[AGENTS.index(requests[0][1])]
            completions = _answer(policy, [(players[m][agent], conversations[m][agent]) for m, agent in requests])
            for (m, agent), completion in zip(requests, completions, strict=True):
                conversations[m][agent].append(Message("assistant", completion.text))
                envs[m].step(completion.text)
                steps[m] += 1
        live = [m for m in live if envs[m].agents]
    records = []
    for m, (env, seed) in enumerate(zip(envs, seeds, strict=True)):
        metrics = [final_info[m][agent]["metrics"] for agent in AGENTS]
        records.append(MatchRecord(
            game=game,
            seed=seed,
            task_id=final_info[m][AGENTS[0]]["task_id"],
            agents=names,
            returns=(returns[m][AGENTS[0]], returns[m][AGENTS[1]]),
            cooperation=tuple(float(x.get("cooperation_rate", math.nan)) for x in metrics),
            invalid_actions=tuple(int(x.get("invalid_actions", 0)) for x in metrics),
            steps=steps[m],
            transcript=env.unwrapped.transcript if keep_transcripts else None,
        ))
        env.close()
    return records


def _answer(policy: Policy, requests: list[tuple[EpisodeAgent, list[Message]]]) -> list[Completion]:
    """Every waiting agent's next action: one generation batch for an LLM policy, else each agent in turn."""
    if isinstance(policy, LLMPolicy) and all(isinstance(agent, LLMEpisode) for agent, _ in requests):
        return policy.generate([agent.request(conversation) for agent, conversation in requests])
    return [as_completion(agent.act(conversation)) for agent, conversation in requests]


def run_tournament(
    game: str,
    agents: Sequence[str] | Mapping[str, Policy],
    *,
    seeds: Sequence[int] = (0, 1, 2),
    env_kwargs: Mapping[str, Any] | None = None,
    exploiters: Sequence[str] | None = None,
    keep_transcripts: bool = False,
) -> TournamentResult:
    """Round robin between ``agents`` on ``game`` (a module name such as ``"prisoners_dilemma_v0"``).

    ``agents``: baseline names of the game (``SOCIAL_BASELINES[game]``) or a mapping name -> ``Policy`` (LLM
    policies built by the caller; the caller closes them). ``exploiters``: baseline names tried as best
    responses for exploitability (default: every baseline of the game). Every match uses ``env_kwargs``.
    """
    load(game)  # a clear error for an unknown game before anything runs
    seeds = seed_list(seeds, allow_none=True)
    if not isinstance(agents, Mapping):
        agents = {name: make_baseline(name, game, seed=_seed_for(game, name, *seeds)) for name in agents}
    if len(agents) < 1:
        raise ValueError("a tournament needs at least one agent")
    exploiter_names = list(SOCIAL_BASELINES.get(game, {}) if exploiters is None else exploiters)
    extra = {name: make_baseline(name, game, seed=_seed_for(game, "exploiter", name, *seeds))
             for name in exploiter_names if name not in agents}

    def play(a: str, b: str, pool: Mapping[str, Policy]) -> list[MatchRecord]:
        return play_matches(game, (pool[a], pool[b]), seeds, names=(a, b), env_kwargs=env_kwargs,
                            keep_transcripts=keep_transcripts)

    pool = {**agents, **extra}
    matches = [record for a in agents for b in agents for record in play(a, b, pool)]
    exploiter_matches = [record for a in agents for y in extra for pair in ((a, y), (y, a))
                         for record in play(*pair, pool)]
    result = TournamentResult(game, list(agents), list(seeds), matches, exploiter_matches)
    for name in agents:
        result.standings[name] = _standing(result, name, exploiter_names)
    return result


def _standing(result: TournamentResult, name: str, exploiters: Sequence[str]) -> Standing:
    own_returns, cooperation, invalid, welfare = [], [], [], []
    for match in result.matches:
        seats = [seat for seat in (0, 1) if match.agents[seat] == name]
        if not seats:
            continue
        welfare.append(match.welfare)
        for seat in seats:
            own_returns.append(match.returns[seat])
            cooperation.append(match.cooperation[seat])
            invalid.append(match.invalid_actions[seat])
    mean_return, half_width = mean_ci95(own_returns)
    margins = {}
    for y in exploiters:
        own, theirs = result.head_to_head(name, y)
        margins[y] = theirs - own
    exploiter = max(margins, key=lambda y: margins[y]) if margins else ""
    return Standing(
        agent=name,
        matches=len(welfare),
        mean_return=mean_return,
        return_ci95=half_width,
        cooperation_rate=_mean(cooperation),
        welfare=_mean(welfare),
        exploitability=margins[exploiter] if exploiter else math.nan,
        exploiter=exploiter,
        invalid_actions=_mean(invalid),
    )


def _mean(values: Sequence[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return sum(finite) / len(finite) if finite else math.nan


def _cell(value: float, digits: int = 2) -> str:
    return "-" if math.isnan(value) else f"{value:.{digits}f}"


def tournament_tables(result: TournamentResult) -> list[Table]:
    """Standings (one row per agent) and the head-to-head matrix of mean returns (row agent vs column)."""
    seeds = f"{len(result.seeds)} seed{'s' if len(result.seeds) != 1 else ''}, both seat orders"
    standings = Table(title=f"{result.game}: round robin, {seeds}")
    for column in ("agent", "return", "cooperation", "welfare", "exploitability", "by", "invalid/match"):
        standings.add_column(column, justify="left" if column in ("agent", "by") else "right")
    ranked = sorted(result.standings.values(), key=lambda s: s.mean_return, reverse=True)
    for s in ranked:
        spread = "" if math.isnan(s.return_ci95) else f" ± {s.return_ci95:.2f}"
        standings.add_row(s.agent, f"{s.mean_return:.2f}{spread}", _cell(s.cooperation_rate), _cell(s.welfare),
                          _cell(s.exploitability), s.exploiter, _cell(s.invalid_actions))
    matrix = Table(title=f"{result.game}: mean return of the row agent against the column agent")
    matrix.add_column("")
    for name in result.agents:
        matrix.add_column(name, justify="right")
    for a in result.agents:
        matrix.add_row(a, *(f"{result.head_to_head(a, b)[0]:.2f}" for b in result.agents))
    return [standings, matrix]


def print_tournament(result: TournamentResult, console: Console | None = None) -> None:
    console = console or Console()
    for table in tournament_tables(result):
        console.print(table)


def write_jsonl(result: TournamentResult, path: str | Path) -> Path:
    """One JSON object per match (round robin and exploiter matches), then one per standing."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for kind, records in (("match", result.matches), ("exploiter_match", result.exploiter_matches)):
            for record in records:
                handle.write(json.dumps({"kind": kind, **asdict(record), "welfare": record.welfare}) + "\n")
        for standing in result.standings.values():
            handle.write(json.dumps({"kind": "standing", "game": result.game, **asdict(standing)}) + "\n")
    return path
