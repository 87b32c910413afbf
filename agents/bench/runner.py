"""``run_bench``: one agent over a whole suite, resumable, with reference scores for normalization.

Per suite entry: work out the reference scores (the ``random`` baseline and the ``oracle``, or the best
baseline where there is none, on the same jobs; cached per suite version under ``cache_dir()/bench``), then
play the jobs not yet in ``DIR/episodes.jsonl``. Single-agent episodes, by a baseline or an LLM, play through
the rollout engine, ``concurrency`` episodes in flight, and are kept whole in ``DIR/episodes.trajectories.jsonl``
(``rl-llm view DIR``); an LLM's jobs go in batches of that size, so the token budget and the episode limit
are checked between batches. A baseline's episodes each draw from their own random stream, so they come out
the same whatever runs beside them. In a two-player game every match is its own job, run on
``concurrency`` threads for backends that batch concurrent requests themselves (vLLM, HTTP APIs).

The agent spec ``oracle`` means each entry's reference agent and ``random`` its random baseline, so both
run on every entry; any other baseline name runs where that baseline exists.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import rl_llm
from rl_llm.agents.bench.episodes import (
    EpisodeLog,
    Job,
    JsonlAppender,
    jobs_for,
    play_game,
    stable_seed,
    trajectory_record,
)
from rl_llm.agents.bench.suite import Suite, SuiteEnv
from rl_llm.agents.evaluate import mean_ci95
from rl_llm.agents.policy import Policy
from rl_llm.errors import RLLMError
from rl_llm.paths import atomic_path, cache_dir
from rl_llm.types import Trajectory


class Unavailable(RLLMError, RuntimeError):
    """An entry that cannot run on this machine (no sandbox backend, no such baseline)."""


class RunDirInUse(RLLMError, ValueError):
    """Another process holds the run directory's lock (two writers would append the same episodes twice)."""


LOCK_FILE = "run.lock"


@contextlib.contextmanager
def run_dir_lock(out: Path) -> Iterator[None]:
    """Hold ``out/run.lock`` (an exclusive ``flock``) for the block: one writer per run directory. The lock
    goes with the process, so a killed run leaves nothing to clean up; a second writer gets ``RunDirInUse``."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows): unlocked, as before
        yield
        return
    with (out / LOCK_FILE).open("a+", encoding="utf-8") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip()
            who = f" (pid {holder})" if holder.isdigit() else ""
            raise RunDirInUse(f"{out} is in use by another rl-llm bench{who}; wait for it to finish or use "
                              "another --out") from None  # fmt: skip
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        try:
            yield
        finally:
            handle.truncate(0)
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


@dataclass
class RunState:
    """What limits the run: the token budget and the number of new episodes (both over the whole run)."""

    max_tokens: int | None = None
    max_episodes: int | None = None
    tokens: int = 0
    new_episodes: int = 0
    stopped: str | None = None
    errors: dict[str, list[str]] = field(default_factory=dict)

    def can_start(self) -> bool:
        if self.max_tokens is not None and self.tokens >= self.max_tokens:
            self.stopped = f"token budget of {self.max_tokens} reached"
        elif self.max_episodes is not None and self.new_episodes >= self.max_episodes:
            self.stopped = f"episode limit of {self.max_episodes} reached"
        return self.stopped is None

    def room(self) -> int | None:
        return None if self.max_episodes is None else max(0, self.max_episodes - self.new_episodes)


def opponents_of(entry: SuiteEnv) -> list[str]:
    from rl_llm.agents.baselines import baselines_for

    return list(entry.opponents or baselines_for(entry.env)) if entry.is_game else []


def _baseline(name: str, entry: SuiteEnv, *parts: object) -> Policy:
    from rl_llm.agents.baselines import make_baseline

    return make_baseline(name, entry.env, seed=stable_seed(name, entry.key, *parts))


def _unavailable(error: Exception) -> Unavailable | None:
    from rl_llm.sandboxes.base import SandboxUnavailable

    return Unavailable(str(error)) if isinstance(error, SandboxUnavailable) else None


def run_baseline(entry: SuiteEnv, name: str, jobs: list[Job], on_record: Callable[[dict], None] | None = None,
                 state: RunState | None = None, trajectories: JsonlAppender | None = None,
                 concurrency: int = 8) -> list[dict[str, Any]]:  # fmt: skip
    """Play ``jobs`` with baseline ``name``: single-agent episodes through the rollout engine (``trajectories``
    keeps them whole), game matches one at a time. Returns the log lines of the episodes that did not fail."""
    if not entry.is_game:
        return _run_single(entry, _baseline(name, entry), jobs, on_record, state, trajectories, concurrency,
                           generated=False)  # fmt: skip
    records = []
    for job in jobs:
        if state is not None and not state.can_start():
            break
        opponent = _baseline(str(job.opponent), entry, "opponent", job.id)
        result = play_game(entry, job, _baseline(name, entry, job.id), opponent)
        result.update(tokens=0, tokens_estimated=False)  # a baseline generates no tokens
        records.append(result)
        if on_record is not None:
            on_record(result)
    return records


def _run_single(entry: SuiteEnv, policy: Policy, jobs: list[Job], finished: Callable[[dict], None] | None,
                state: RunState | None, trajectories: JsonlAppender | None, concurrency: int,
                generated: bool) -> list[dict[str, Any]]:  # fmt: skip
    """Single-agent jobs by any agent through the rollout engine. Each trajectory is kept whole (``group_id`` =
    the job id) and its log line written as it ends; a failed episode is not logged as done (a resumed run
    plays it again) but counted in ``state.errors``."""
    from rl_llm.agents.rollout import collect

    by_seed = {job.seed: job for job in jobs}
    records: list[dict[str, Any]] = []

    def ended(trajectory: Trajectory) -> None:
        job = by_seed[int(trajectory.seed)]
        if trajectory.error:
            if "failed: SandboxUnavailable:" in trajectory.error:  # this machine cannot run the entry at all
                raise Unavailable(trajectory.error)
            if state is not None:
                state.errors.setdefault(entry.key, []).append(trajectory.error)
            return
        if trajectories is not None:
            trajectories.append_line(replace(trajectory, group_id=job.id).to_json())
        result = trajectory_record(entry, job, trajectory, generated)
        records.append(result)
        if finished is not None:
            finished(result)

    collect(entry.env, policy, [job.seed for job in jobs], env_kwargs=dict(entry.kwargs), concurrency=concurrency,
            on_trajectory=ended)  # fmt: skip
    return records


@functools.cache
def code_fingerprint() -> str:
    """Changes whenever a file of the environments or the baselines does (size or modification time), so a
    cached reference score is never reused after the code that produced it changed (a development tree)."""
    from rl_llm import agents, envs

    roots = [Path(envs.__file__).parent, Path(agents.__file__).parent / "baselines"]
    digest = hashlib.sha256()
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            stat = path.stat()
            digest.update(f"{path.relative_to(root)}:{stat.st_size}:{stat.st_mtime_ns};".encode())
    return digest.hexdigest()[:12]


def reference_scores(suite: Suite, entry: SuiteEnv, cache: Path | None = None) -> dict[str, Any]:
    """Mean returns of ``random`` and of the reference agent on the entry's jobs, cached per suite version
    (and entry settings and rl-llm version) under ``cache`` (default ``cache_dir()/bench``)."""
    from rl_llm.agents.baselines import baselines_for

    cache = cache if cache is not None else cache_dir() / "bench"
    path = cache / suite.id / f"{entry.key}-{entry.digest()}-{rl_llm.__version__}-{code_fingerprint()}.json"
    if path.exists():
        return json.loads(path.read_text(encoding="utf-8"))
    jobs = jobs_for(entry, opponents_of(entry))
    if entry.reference:
        candidates = [entry.reference]
    elif "oracle" in baselines_for(entry.env):
        candidates = ["oracle"]
    else:
        candidates = [name for name in baselines_for(entry.env) if name != "random"]
    scores = {name: mean_return(run_baseline(entry, name, jobs)) for name in {"random", *candidates}}
    best = max(candidates, key=lambda name: (scores[name], name))
    data = {
        "random": scores["random"],
        "reference": scores[best],
        "reference_agent": best,
        "baselines": scores,
    }
    with atomic_path(path) as partial:
        partial.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
    return data


def mean_return(records: list[dict[str, Any]]) -> float:
    return mean_ci95(record["episode_return"] for record in records)[0]


def run_bench(
    suite: Suite,
    agent: str,
    out: str | Path,
    *,
    concurrency: int = 8,
    max_tokens_budget: int | None = None,
    max_episodes: int | None = None,
    policy_options: dict[str, Any] | None = None,
    reference_cache: Path | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run (or resume) ``agent`` on ``suite`` into ``out``; returns the results (also ``out/results.json``).
    The run holds ``out/run.lock`` throughout: a second run on the same ``out`` raises ``RunDirInUse``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with run_dir_lock(out):  # one writer per directory, for the whole run
        return _run_bench(suite, agent, out, concurrency, max_tokens_budget, max_episodes, policy_options,
                          reference_cache, log)  # fmt: skip


def _run_bench(suite: Suite, agent: str, out: Path, concurrency: int, max_tokens_budget: int | None,
               max_episodes: int | None, policy_options: dict[str, Any] | None, reference_cache: Path | None,
               log: Callable[[str], None]) -> dict[str, Any]:  # fmt: skip
    from rl_llm.agents import is_llm_spec, make_policy
    from rl_llm.agents.baselines import baselines_for
    from rl_llm.agents.bench.report import build_results, write_reports

    _check_run(out, suite, agent)
    episode_log = EpisodeLog(out / "episodes.jsonl")
    done = episode_log.load()
    state = RunState(max_tokens_budget, max_episodes, tokens=sum(r.get("tokens", 0) for r in done.values()))

    lock = threading.Lock()

    def finished(result: dict[str, Any]) -> None:  # from the game threads or the rollout engine's loop
        episode_log.append(result)
        with lock:
            done[result["id"]] = result
            state.tokens += int(result.get("tokens", 0))
            state.new_episodes += 1

    references: dict[str, dict[str, Any]] = {}
    unavailable: dict[str, str] = {}
    policy: Policy | None = None
    try:
        for entry in suite.envs:
            try:
                references[entry.key] = reference_scores(suite, entry, reference_cache)
                jobs = [job for job in jobs_for(entry, opponents_of(entry)) if job.id not in done]
                if not jobs or not state.can_start():
                    continue
                log(f"{entry.key}: {len(jobs)} episode(s) to play")
                if is_llm_spec(agent):
                    if policy is None:
                        policy = make_policy(
                            agent, entry.env, **_llm_options(agent, concurrency, policy_options)
                        )
                    _run_llm(entry, policy, jobs, out, finished, state, concurrency)
                    continue
                name = {"oracle": references[entry.key]["reference_agent"]}.get(agent, agent)
                if name not in baselines_for(entry.env):
                    raise Unavailable(f"{entry.env} has no baseline {agent!r}")
                room = state.room()
                run_baseline(entry, name, jobs if room is None else jobs[:room], finished, state,
                             JsonlAppender(out / "episodes.trajectories.jsonl"), concurrency)  # fmt: skip
            except Exception as error:
                problem = error if isinstance(error, Unavailable) else _unavailable(error)
                if problem is None:
                    raise
                unavailable[entry.key] = str(problem)
                log(f"{entry.key}: skipped: {problem}")
    finally:
        if policy is not None:
            policy.close()
    results = build_results(suite, agent, done, references, unavailable, state)
    write_reports(results, out)
    return results


def _llm_options(agent: str, concurrency: int, options: dict[str, Any] | None) -> dict[str, Any]:
    options = {key: value for key, value in (options or {}).items() if value is not None}
    if agent.startswith("openai:") or (agent.startswith("vllm:") and "://" in agent):
        options.setdefault("max_concurrency", concurrency)  # requests in flight to the endpoint
    else:
        options.pop("max_retries", None)  # in-process backends make no requests to retry
    return options


def _check_run(out: Path, suite: Suite, agent: str) -> None:
    """A run directory belongs to one suite version and one agent: resuming it with others would mix them."""
    path = out / "run.json"
    identity = {"suite": suite.id, "agent": agent}
    if path.exists():
        previous = json.loads(path.read_text(encoding="utf-8"))
        if {key: previous.get(key) for key in identity} != identity:
            raise ValueError(f"{out} holds a run of {previous.get('agent')} on {previous.get('suite')}; "
                             f"use another --out for {agent} on {suite.id}")  # fmt: skip
        return
    with atomic_path(path) as partial:
        partial.write_text(json.dumps({**identity, "rl_llm_version": rl_llm.__version__}), encoding="utf-8")


def _run_llm(entry: SuiteEnv, policy: Policy, jobs: list[Job], out: Path, finished: Callable[[dict], None],
             state: RunState, concurrency: int) -> None:  # fmt: skip
    # Single-agent episodes: Trajectory records (``read_trajectories``), ``group_id`` = the episode id; game
    # matches: their transcripts, in matches.jsonl.
    trajectories = JsonlAppender(out / ("matches.jsonl" if entry.is_game else "episodes.trajectories.jsonl"))
    while jobs and state.can_start():
        room = state.room()
        size = concurrency if room is None else min(concurrency, room)
        batch, jobs = jobs[:size], jobs[size:]
        if entry.is_game:
            _run_game_batch(entry, policy, batch, trajectories, finished, state, concurrency)
        else:
            _run_single_batch(entry, policy, batch, trajectories, finished, state, concurrency)


def _run_single_batch(entry: SuiteEnv, policy: Policy, batch: list[Job], trajectories: JsonlAppender,
                      finished: Callable[[dict], None], state: RunState, concurrency: int) -> None:  # fmt: skip
    _run_single(entry, policy, batch, finished, state, trajectories, concurrency, generated=True)


def _run_game_batch(entry: SuiteEnv, policy: Policy, batch: list[Job], trajectories: JsonlAppender,
                    finished: Callable[[dict], None], state: RunState, concurrency: int) -> None:  # fmt: skip
    def one(job: Job) -> None:
        opponent = _baseline(str(job.opponent), entry, "opponent", job.id)
        try:
            result = play_game(entry, job, policy, opponent, keep_transcript=True)
        except Exception as error:  # a generation that failed for good: recorded, played again on resume
            state.errors.setdefault(entry.key, []).append(f"{type(error).__name__}: {error}")
            return
        transcript = result.pop("transcript", None)
        trajectories.append_line(json.dumps({"id": job.id, "transcript": transcript}, ensure_ascii=False))
        finished(result)

    workers = concurrency if getattr(policy, "concurrent", False) else 1
    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(one, batch))
