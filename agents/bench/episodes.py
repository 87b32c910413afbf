"""Episode jobs, how each kind is played, and the append-only log that makes a benchmark run resumable.

A job is one episode of the suite: ``(env key, seed)`` for a single-agent env, ``(env key, opponent, seat,
seed)`` for a two-player game. Single-agent episodes, by any agent, are played by the rollout engine and
kept whole as ``Trajectory`` records; the log line of a job (a flat dict: its id, figures, tokens, success)
is written to ``DIR/episodes.jsonl`` the moment the episode ends, so a run killed at any point loses at most
the episodes in flight; on restart the log's ids say what is done. A baseline draws each episode's random
choices from its own stream, seeded from the baseline's seed and the episode (``EpisodeStart.rng``), so an
episode's outcome never depends on which episodes ran before or beside it (resumed == uninterrupted).
"""

from __future__ import annotations

import json
import math
import threading
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl_llm.agents.bench.suite import SuiteEnv
from rl_llm.agents.policy import Completion, EpisodeAgent, EpisodeStart, Policy, as_completion
from rl_llm.types import Message, Trajectory

CHARS_PER_TOKEN = 4  # estimate for chat-only backends, which report text but no token ids


@dataclass(frozen=True)
class Job:
    key: str
    seed: int
    opponent: str | None = None
    seat: int | None = None

    @property
    def id(self) -> str:
        if self.opponent is None:
            return f"{self.key}/{self.seed}"
        return f"{self.key}/{self.opponent}/{self.seat}/{self.seed}"


def jobs_for(entry: SuiteEnv, opponents: Sequence[str] = ()) -> list[Job]:
    if not entry.is_game:
        return [Job(entry.key, seed) for seed in entry.seeds]
    return [
        Job(entry.key, seed, opponent, seat)
        for opponent in opponents
        for seat in (0, 1)
        for seed in entry.seeds
    ]


def stable_seed(*parts: object) -> int:
    """A seed from names that is the same in every process (``hash()`` of a str is not)."""
    return zlib.crc32("|".join(map(str, parts)).encode())


def token_count(completion: Completion) -> tuple[int, bool]:
    """(tokens, estimated): the generated token ids where the backend reports them, else chars / 4."""
    if completion.token_ids is not None:
        return len(completion.token_ids), False
    return math.ceil(len(completion.text) / CHARS_PER_TOKEN), True


def success(entry: SuiteEnv, metrics: dict[str, float]) -> float | None:
    if entry.success is None:
        return None
    return float(float(metrics.get(entry.success, 0.0)) >= 1.0)


def record(entry: SuiteEnv, job: Job, **fields: Any) -> dict[str, Any]:
    metrics = {name: float(value) for name, value in fields.pop("metrics", {}).items()}
    return {"id": job.id, "env": job.key, "seed": job.seed, "opponent": job.opponent, "seat": job.seat,
            **fields, "success": success(entry, metrics), "metrics": metrics}  # fmt: skip


class Counting(Policy):
    """Wraps an agent to count the turns and generated tokens of the episodes it plays (one wrapper per match)."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.name = inner.name
        self.turns = 0
        self.tokens = 0
        self.estimated = False

    def start_episode(self, episode: EpisodeStart) -> EpisodeAgent:
        return _Counted(self, self.inner.start_episode(episode))

    def count(self, completion: Completion) -> Completion:
        self.turns += 1
        tokens, estimated = token_count(completion)
        self.tokens += tokens
        self.estimated |= estimated
        return completion


class _Counted(EpisodeAgent):
    def __init__(self, counter: Counting, agent: EpisodeAgent) -> None:
        self.counter, self.agent = counter, agent

    def act(self, conversation: Sequence[Message]) -> Completion:
        return self.counter.count(as_completion(self.agent.act(conversation)))

    async def aact(self, conversation: Sequence[Message]) -> Completion:
        return self.counter.count(as_completion(await self.agent.aact(conversation)))

    def end(self, trajectory: Trajectory) -> None:
        self.agent.end(trajectory)


def play_game(
    entry: SuiteEnv, job: Job, agent: Policy, opponent: Policy, keep_transcript: bool = False
) -> dict:
    """One match of a two-player game: the agent in seat ``job.seat`` against a baseline."""
    from rl_llm.agents.tournament import play_matches

    counted = Counting(agent)
    seat = int(job.seat or 0)
    seats = (counted, opponent) if seat == 0 else (opponent, counted)
    names = ("agent", str(job.opponent)) if seat == 0 else (str(job.opponent), "agent")
    [match] = play_matches(entry.env, seats, [job.seed], names=names, env_kwargs=entry.kwargs,
                           keep_transcripts=keep_transcript)  # fmt: skip
    metrics = {"opponent_return": match.returns[1 - seat], "welfare": match.welfare}
    if not math.isnan(match.cooperation[seat]):
        metrics["cooperation"] = match.cooperation[seat]
    extra = {"transcript": match.transcript} if keep_transcript else {}
    return record(entry, job, episode_return=match.returns[seat], turns=counted.turns,
                  invalid_actions=match.invalid_actions[seat], tokens=counted.tokens,
                  tokens_estimated=counted.estimated, metrics=metrics, **extra)  # fmt: skip


def trajectory_record(entry: SuiteEnv, job: Job, trajectory: Trajectory, generated: bool = True) -> dict[str, Any]:
    """The log line of a single-agent episode (the rollout engine's trajectory, kept whole beside the log):
    its job, its figures and, for an agent that ``generated`` text (an LLM), its tokens."""
    if not generated:
        tokens, estimated = 0, False
    elif trajectory.token_ids:
        tokens, estimated = trajectory.num_policy_tokens, False
    else:
        tokens, estimated = (
            math.ceil(sum(len(turn.action) for turn in trajectory.turns) / CHARS_PER_TOKEN),
            True,
        )
    return record(entry, job, episode_return=trajectory.total_reward, turns=len(trajectory.turns),
                  invalid_actions=sum(turn.invalid_action for turn in trajectory.turns), tokens=tokens,
                  tokens_estimated=estimated, metrics=trajectory.metrics)  # fmt: skip


class EpisodeLog:
    """``episodes.jsonl``: one finished episode per line, appended (and flushed) as each ends."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def load(self) -> dict[str, dict[str, Any]]:
        """Records by id. A last line cut short by a kill is dropped (and cut from the file, so appends stay
        line-aligned); that episode simply runs again."""
        if not self.path.exists():
            return {}
        data = self.path.read_bytes()
        complete = data[: data.rfind(b"\n") + 1]
        if len(complete) != len(data):
            with self.path.open("r+b") as handle:
                handle.truncate(len(complete))
        records: dict[str, dict[str, Any]] = {}
        for line in complete.decode("utf-8").splitlines():
            if line.strip():
                entry = json.loads(line)
                records.setdefault(entry["id"], entry)  # the first copy wins; there should be only one
        return records

    def append(self, entry: dict[str, Any]) -> None:
        line = json.dumps(entry, ensure_ascii=False) + "\n"
        with self._lock, self.path.open("a", encoding="utf-8") as handle:
            handle.write(line)
            handle.flush()


class JsonlAppender:
    """Appends JSON lines from any thread (the trajectories of LLM episodes)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def append_line(self, line: str) -> None:
        with self._lock, self.path.open("a", encoding="utf-8") as handle:
            handle.write(line + "\n")
