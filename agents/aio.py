"""One long-lived asyncio event loop on a daemon thread, shared by the rollout engine and async backends.

Async clients and engines (httpx, vLLM's ``AsyncLLM``) bind to the loop they were first used on, so every
rollout runs on this same loop. ``run_sync(coroutine)`` runs a coroutine there and blocks the calling
thread for its result; it works from plain scripts and from inside another event loop (a notebook).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from concurrent.futures import CancelledError
from typing import Any, TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None


def background_loop() -> asyncio.AbstractEventLoop:
    global _loop, _thread
    with _lock:
        if _loop is None or _thread is None or not _thread.is_alive():
            _loop = asyncio.new_event_loop()
            _thread = threading.Thread(target=_loop.run_forever, name="rl-llm-event-loop", daemon=True)
            _thread.start()
        return _loop


def run_sync(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run ``coroutine`` on the background loop and wait for it; Ctrl-C cancels it."""
    loop = background_loop()
    if threading.current_thread() is _thread:
        coroutine.close()
        raise RuntimeError("run_sync was called from the rl-llm event loop itself; await the coroutine instead")
    future = asyncio.run_coroutine_threadsafe(coroutine, loop)
    try:
        return future.result()
    except (KeyboardInterrupt, CancelledError):
        future.cancel()
        raise
