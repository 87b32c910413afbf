"""Where rl-llm keeps what it builds once and reuses: the tiny model, BM25 indexes, the generated KB."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """``$RL_LLM_CACHE``, else ``$XDG_CACHE_HOME/rl-llm`` (``~/.cache/rl-llm``)."""
    if os.environ.get("RL_LLM_CACHE"):
        return Path(os.environ["RL_LLM_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rl-llm"
