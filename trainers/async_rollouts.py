"""The generator side of asynchronous training: a thread that plays the episodes of the coming steps.

``BackgroundRollouts(run)`` plays the groups of step ``k`` as soon as the trainer has published weights of
version ``k - 1 - max_staleness`` or newer, and hands batches to the trainer in step order
(``next_batch()``). With ``max_staleness = 0`` every step waits for the previous update, which is the
synchronous schedule exactly; with ``N > 0`` generation runs up to N updates ahead while the trainer works.

Partial rollouts (APRIL, ``rollout.partial_rollouts``): each step starts ``partial_extra_groups`` more groups
than it needs. Once ``prompts_per_step`` groups have finished, the episodes still running are paused between
two turns and resumed in the next step with the newer weights; finished episodes of unfinished groups wait
for their group. A batch takes every group that has finished (at least ``prompts_per_step``). A long episode therefore no longer holds up the whole batch, and nothing is thrown away.
Each turn keeps the policy version that produced it (``turn.info["policy_version"]``).

Dynamic sampling (``rollout.filter``, trainers/filtering.py) gates each finished group here, on the generator
side, and refills from the seed stream: a full-rollout step plays replacement rounds, a partial one opens
replacement groups beside the paused ones and waits for as many to finish as are missing. A batch's seeds are
every group drawn for it, kept or dropped, so the ledger below consumes dropped groups too.

Which groups a batch consumes is a pure function of seeds: group ``s`` is the ``group_size`` episodes of the
task with seed ``s``. The trainer records consumed seeds (``SeedLedger``) in its checkpoints, so a run killed
at any point and resumed re-plays the groups that were started but not consumed (from scratch: the
in-flight state is not saved) and never a consumed one: no episode is lost or used twice.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from rl_llm.agents.rollout import EpisodeJob, PausedEpisode, RolloutEngine
from rl_llm.trainers.filtering import GroupCounts, fill_groups, passes, readmit
from rl_llm.types import Trajectory


@dataclass
class RolloutBatch:
    """The episodes of one training step, and how the generator spent its time producing them."""

    step: int
    trajectories: list[Trajectory]
    seeds: list[int]  # the groups (task seeds) this batch consumes, each with all its group_size episodes
    generation_s: float  # generator busy time for this batch
    idle_s: float  # generator time spent waiting for new enough weights before this batch
    paused: int = 0  # episodes left paused for the next step (partial rollouts)
    groups: dict[str, float] = field(default_factory=dict)  # drawn/kept/dropped counts (trainers/filtering.py)
    # A two-player game: the step's matches, both seats each; ``trajectories`` are their learner seats, and the
    # advantages need both seats of a match (trainers/social.py match_advantages).
    matches: list[Any] | None = None


@dataclass
class SeedLedger:
    """Which task seeds (groups) the trainer has consumed, in a form a checkpoint can hold.

    ``next_seed``: every seed below it was either consumed or is listed in ``pending`` (started, not
    consumed: a resumed run plays those again first). Seeds at or above ``next_seed`` were never consumed.
    """

    next_seed: int
    pending: list[int] = field(default_factory=list)

    def consume(self, seeds: list[int]) -> None:
        pending = set(self.pending)
        for seed in seeds:
            if seed in pending:
                pending.discard(seed)
            elif seed >= self.next_seed:
                pending.update(range(self.next_seed, seed))
                self.next_seed = seed + 1
            else:
                raise RuntimeError(f"group seed {seed} was consumed twice")
        self.pending = sorted(pending)


class BackgroundRollouts:
    """Plays steps ``run.step + 1 .. config.steps`` on a thread, at most ``max_staleness`` versions ahead."""

    def __init__(self, run: Any) -> None:
        config = run.config
        self.run = run
        self.max_staleness = int(config.rollout.max_staleness or 0)
        self.partial = bool(config.rollout.partial_rollouts)
        self.extra_groups = int(config.rollout.partial_extra_groups) if self.partial else 0
        self.group_size = config.rollout.group_size
        self.groups_per_step = config.rollout.prompts_per_step
        # Dynamic sampling (trainers/filtering.py): gate each finished group here, refill from the seed stream;
        # a batch's seeds are every group drawn, so the ledger consumes dropped groups too.
        self.filter = config.rollout.filter
        self.min_episodes = config.optim.minibatches
        self.first_step, self.last_step = run.step + 1, config.steps
        # Groups to play, oldest first: the ones a killed run had started but not consumed, then new seeds.
        self._restart = list(run.pending_seeds)
        self._next_seed = run.next_seed
        self._open: dict[int, list[Trajectory | PausedEpisode | None]] = {}  # partial: groups in flight
        self._version = run.generator.policy_version
        self._stopping = False
        self._changed = threading.Condition()
        self._batches: queue.Queue[RolloutBatch | BaseException] = queue.Queue()
        self._restore_threads = split_cores(run.generator) if self.max_staleness > 0 else None
        self._thread = threading.Thread(target=self._produce, name="rl-llm-rollouts", daemon=True)
        self._thread.start()

    # -- trainer side -------------------------------------------------------------------------------------
    def publish(self, version: int) -> None:
        """The trainer's weights of ``version`` are now what the generator uses: later steps may start."""
        with self._changed:
            self._version = version
            self._changed.notify_all()

    def next_batch(self) -> RolloutBatch:
        item = self._batches.get()
        if isinstance(item, BaseException):
            raise RuntimeError("the rollout thread failed") from item
        return item

    def close(self) -> None:
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        self._thread.join()
        if self._restore_threads is not None:
            self._restore_threads()
        for group in self._open.values():  # partial rollouts never resumed: release their envs
            for member in group:
                if isinstance(member, PausedEpisode):
                    member.close()
        self._open.clear()

    def __enter__(self) -> BackgroundRollouts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- generator side -----------------------------------------------------------------------------------
    def _engine(self) -> RolloutEngine:
        # A fresh engine per step, as the synchronous loop's collect() makes: its batching adapts to the
        # previous generation call, and N=0 must batch (and so round) exactly as the synchronous run does.
        rollout = self.run.config.rollout
        return RolloutEngine(self.run.generator, self.run.make_env, max_new_tokens=rollout.max_new_tokens,
                             concurrency=rollout.concurrency)  # fmt: skip

    def _new_seed(self) -> int:
        if self._restart:
            return self._restart.pop(0)
        self._next_seed += 1
        return self._next_seed - 1

    def _produce(self) -> None:
        try:
            for step in range(self.first_step, self.last_step + 1):
                waited = time.perf_counter()
                with self._changed:
                    # Step k may use weights of version k - 1 - N or newer (version v = after v updates).
                    self._changed.wait_for(lambda s=step: self._stopping or self._version >= s - 1 - self.max_staleness)
                    if self._stopping:
                        return
                idle = time.perf_counter() - waited
                started = time.perf_counter()
                matches = None
                if self.run.opponents is not None:  # a game: whole matches (partial rollouts are refused for games)
                    # no dynamic sampling for games (refused at config), so no group counts, as synchronously
                    (trajectories, seeds, matches), paused, groups = self._play_matches(), 0, {}
                else:
                    trajectories, seeds, paused, counts = self._play_partial() if self.partial else self._play_full()
                    groups = counts.metrics()
                self._batches.put(RolloutBatch(step, trajectories, seeds, time.perf_counter() - started, idle, paused,
                                               groups, matches))  # fmt: skip
        except BaseException as error:  # the trainer re-raises it from next_batch
            self._batches.put(error)

    def _play_full(self) -> tuple[list[Trajectory], list[int], int, GroupCounts]:
        seeds = [self._new_seed() for _ in range(self.groups_per_step)]
        drawn: list[int] = []

        def play(batch: list[int]) -> list[Trajectory]:
            drawn.extend(batch)
            jobs = [EpisodeJob(seed=seed, group_index=g) for seed in batch for g in range(self.group_size)]
            return self._engine().run(jobs)

        if not self.filter.enabled:
            return play(seeds), seeds, 0, GroupCounts(len(seeds), len(seeds), rounds=1)
        trajectories, counts = fill_groups(play, lambda n: [self._new_seed() for _ in range(n)], seeds,
                                           self.groups_per_step, self.filter, self.min_episodes)  # fmt: skip
        return trajectories, drawn, 0, counts

    def _play_matches(self) -> tuple[list[Trajectory], list[int], list[Any]]:
        """A two-player game's step: ``group_size`` matches per seed group, as the synchronous loop plays them
        (``TrainingRun.play_matches``: the opponents' plan, seeded per request), so N=0 repeats it exactly. The
        batch's trajectories are the learner seats; its matches hold both seats."""
        from rl_llm.trainers.social import learner_trajectories

        seeds = [self._new_seed() for _ in range(self.groups_per_step)]
        matches = self.run.play_matches(seeds)
        return learner_trajectories(matches), seeds, matches

    def _play_partial(self) -> tuple[list[Trajectory], list[int], int, GroupCounts]:
        while len(self._open) < self.groups_per_step + self.extra_groups:
            self._open[self._new_seed()] = [None] * self.group_size
        counts, kept, dropped, extra, need = GroupCounts(), [], [], 0, self.groups_per_step
        while True:  # one round without a filter; with one, refill rounds until enough groups pass (or the bound)
            counts.rounds += 1
            for seed, group in self._partial_round(need):
                counts.drawn += 1
                (kept if passes(group, self.filter) else dropped).append((seed, group))
            missing, room = self.groups_per_step - len(kept), self.filter.max_extra_groups - extra
            if not self.filter.enabled or missing <= 0 or room <= 0:
                break
            for _ in range(min(missing, room)):  # replacement groups, on top of those still open
                self._open[self._new_seed()] = [None] * self.group_size
                extra += 1
            need = missing
        counts.kept, counts.dropped = len(kept), len(dropped)
        chosen = kept + [(group[0].seed, group) for group in
                         readmit([g for _, g in kept], [g for _, g in dropped], self.min_episodes)]  # fmt: skip
        counts.readmitted = len(chosen) - len(kept)
        trajectories = [member for _, group in chosen for member in group]
        paused = sum(isinstance(m, PausedEpisode) for members in self._open.values() for m in members)
        return trajectories, [seed for seed, _ in kept + dropped], paused, counts

    def _partial_round(self, need: int) -> list[tuple[int, list[Trajectory]]]:
        """Play the open groups until ``need`` of them have finished (the rest pause); take every finished one."""
        jobs, slots = [], []
        for seed, members in self._open.items():
            for g, member in enumerate(members):
                if isinstance(member, Trajectory):
                    continue  # finished earlier; its group is still waiting for the others
                resume = member if isinstance(member, PausedEpisode) else None
                jobs.append(EpisodeJob(seed=seed, group_index=g, resume=resume))
                slots.append((seed, g))

        def enough_groups_done(finished: list[Trajectory]) -> bool:
            done = {(t.seed, t.group_index) for t in finished}
            complete = sum(
                all(isinstance(m, Trajectory) or (seed, g) in done for g, m in enumerate(members))
                for seed, members in self._open.items()
            )  # fmt: skip
            return complete >= need

        results = self._engine().run(jobs, until=enough_groups_done)
        for (seed, g), result in zip(slots, results, strict=True):
            self._open[seed][g] = result
        # Every finished group goes into this batch (at least prompts_per_step of them): a finished group kept
        # for later would only grow staler, while paused episodes go on with the newer weights.
        taken = [seed for seed, members in self._open.items() if all(isinstance(m, Trajectory) for m in members)]
        return [(seed, self._open.pop(seed)) for seed in taken]


def split_cores(generator: Any) -> Callable[[], None] | None:
    """Give an in-process generator half of torch's CPU threads and the trainer the rest, for the run.

    Generation and the update now run at the same time; with torch's default (every core for each) the two
    thread teams would fight over the same cores. Torch's thread count is per calling thread, so the
    generation thread and this one are set apart. Returns the undo, or None where there is nothing to split
    (a server generates in its own process, or a single core).
    """
    total = torch.get_num_threads()
    thread = getattr(generator, "generation_thread", None)
    if total < 2 or thread is None or getattr(generator, "concurrent", False):
        return None
    thread().submit(torch.set_num_threads, total // 2).result()
    torch.set_num_threads(total - total // 2)

    def restore() -> None:
        thread().submit(torch.set_num_threads, total).result()
        torch.set_num_threads(total)

    return restore
