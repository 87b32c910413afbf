"""A person at the terminal as an agent (``rl-llm play``): each turn shows the observation and reads a line.

``Human`` is a ``Policy`` like any baseline, so a person plays through the rollout engine and the episode is
an ordinary ``Trajectory``. A bare answer is wrapped in the env's first action tag (``B2`` ->
``<move>B2</move>``); an answer with a ``<`` is sent as typed. End of input (Ctrl-D) stops the episode: the
engine records it as ended by an error, and ``human.quit`` says so.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from typing import Any

from rich.text import Text

from rl_llm.agents.policy import EpisodeAgent, EpisodeStart, Policy
from rl_llm.types import Message, Trajectory


class Human(Policy):
    name = "human"

    def __init__(self, console: Any = None, read: Callable[[str], str] = input) -> None:
        if console is None:
            from rl_llm.console import make_console

            console = make_console()
        self.console = console
        self.read = read
        self.quit = False

    def start_episode(self, episode: EpisodeStart) -> EpisodeAgent:
        info, stop = episode.info, episode.stop
        tag = stop[0][2:-1] if stop and stop[0].startswith("</") else None
        env_id = getattr(getattr(episode.env, "spec", None), "id", None) or type(episode.env).__name__
        header = f"  task {info.get('task_id', '')}\n\n{info.get('system_prompt', '')}\n"
        self.console.print(Text.assemble((env_id, "bold"), header))
        if tag:
            self.console.print(f"(Type a full turn, or just the {tag} content; it is wrapped in <{tag}></{tag}> for you.)")
        return _Terminal(self, episode, tag)


class _Terminal(EpisodeAgent):
    def __init__(self, human: Human, episode: EpisodeStart, tag: str | None) -> None:
        self.human, self.episode, self.tag = human, episode, tag

    def act(self, conversation: Sequence[Message]) -> str:
        last = conversation[-1].content if conversation else ""
        self.human.console.print(f"\n{last}", markup=False)
        try:
            action = self.human.read("> ")
        except EOFError:
            self.human.quit = True
            raise
        return f"<{self.tag}>{action}</{self.tag}>" if self.tag and "<" not in action else action

    async def aact(self, conversation: Sequence[Message]) -> str:
        # Read on a daemon thread: the engine's loop stays free, and Ctrl-C in the main thread can exit while
        # a read is pending (a worker thread blocked in input() would hold the interpreter's exit).
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[str] = loop.create_future()

        def read() -> None:
            try:
                result = self.act(conversation)
            except Exception as error:  # EOFError: handed to the episode (signals go to the main thread)
                loop.call_soon_threadsafe(_settle, answer, None, error)
            else:
                loop.call_soon_threadsafe(_settle, answer, result, None)

        threading.Thread(target=read, name="rl-llm-human", daemon=True).start()
        return await answer

    def end(self, trajectory: Trajectory) -> None:
        if trajectory.error is not None:
            return
        console = self.human.console
        transcript = getattr(self.episode.env.unwrapped, "transcript", None)
        final = transcript.rsplit("\n\n", 1)[-1] if transcript else (trajectory.turns[-1].observation if trajectory.turns else "")
        console.print(final, markup=False)
        how = "terminated" if trajectory.terminated else "truncated"
        console.print(f"\nEpisode over ({how}). Return: {trajectory.total_reward:g}")
        console.print(f"Metrics: {trajectory.metrics}", markup=False)


def _settle(future: asyncio.Future[str], result: str | None, error: Exception | None) -> None:
    if future.done():  # the episode was cancelled meanwhile
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result or "")
