"""Batching of generation requests for backends that generate a batch per call (``hf``, offline vLLM).

Whenever the generator is free, the scheduler sends whatever requests are waiting as one batch. It holds
a batch back only while more requests are certain to come soon: while some live episodes are still in
an env step, for at most ``gather_timeout_s`` (by default a tenth of the last generation call, so waiting
costs at most about 10%). A slow env therefore never holds the others up: its episode joins a later batch,
and episodes of very different lengths run out of phase instead of in lock-step.

Generation runs on the policy's generation thread, so env steps (on the engine's thread pool) overlap with it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from rl_llm.agents.llm import GenerationRequest
from rl_llm.agents.policy import Completion

GenerateBatch = Callable[[Sequence[GenerationRequest]], list[Completion]]


@dataclass
class BatchStats:
    batch_sizes: list[int] = field(default_factory=list)

    @property
    def mean_batch_size(self) -> float:
        return sum(self.batch_sizes) / len(self.batch_sizes) if self.batch_sizes else 0.0


class BatchScheduler:
    def __init__(
        self,
        generate: GenerateBatch,
        expected_requests: Callable[[], int],
        executor: ThreadPoolExecutor,
        max_batch_size: int = 64,
        gather_timeout_s: float | None = None,
    ) -> None:
        self._generate = generate
        self._expected = expected_requests
        self.max_batch_size = max_batch_size
        self._fixed_timeout = gather_timeout_s
        self._last_call_s = 0.02
        self._pending: list[tuple[GenerationRequest, asyncio.Future[Completion]]] = []
        self._changed = asyncio.Event()
        self._executor = executor
        self.stats = BatchStats()

    async def submit(self, request: GenerationRequest) -> Completion:
        future: asyncio.Future[Completion] = asyncio.get_running_loop().create_future()
        self._pending.append((request, future))
        self._changed.set()
        return await future

    def notify(self) -> None:
        """Tell the scheduler the number of live episodes changed (one ended)."""
        self._changed.set()

    async def run(self) -> None:
        """The scheduling loop; run it as a task and cancel it when the rollout is over."""
        try:
            while True:
                await self._changed.wait()
                self._changed.clear()
                if self._pending:
                    await self._gather()
                    await self._dispatch()
        finally:
            for _, future in self._pending:
                future.cancel()

    async def _gather(self) -> None:
        loop = asyncio.get_running_loop()
        timeout = self._fixed_timeout if self._fixed_timeout is not None else 0.1 * self._last_call_s
        deadline = loop.time() + timeout
        while len(self._pending) < min(self._expected(), self.max_batch_size):
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except asyncio.TimeoutError:
                return
            self._changed.clear()

    async def _dispatch(self) -> None:
        batch, self._pending = self._pending[: self.max_batch_size], self._pending[self.max_batch_size :]
        if self._pending:
            self._changed.set()
        started = time.perf_counter()
        try:
            completions = await asyncio.get_running_loop().run_in_executor(
                self._executor, self._generate, [request for request, _ in batch]
            )
            if len(completions) != len(batch):
                raise RuntimeError(f"the backend returned {len(completions)} completions for {len(batch)} requests")
        except Exception as error:  # every waiting episode learns why its request failed
            for _, future in batch:
                if not future.done():
                    future.set_exception(error)
        else:
            for (_, future), completion in zip(batch, completions):
                if not future.done():
                    future.set_result(completion)
        self._last_call_s = time.perf_counter() - started
        self.stats.batch_sizes.append(len(batch))
