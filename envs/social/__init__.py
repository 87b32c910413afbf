"""rl_llm.envs.social: two-player text games with PettingZoo's API (docs/design.md#two-player-games).

Each game is a module following PettingZoo's convention: ``module.parallel_env(**kwargs)``,
``module.env(**kwargs)`` (AEC) and ``module.raw_env``. ``load(name)`` imports one by name.
"""

from __future__ import annotations

import importlib
from types import ModuleType

# name -> one-line summary (for `rl-llm list`)
GAMES: dict[str, str] = {
    "prisoners_dilemma_v0": "iterated prisoner's dilemma, <A>/<B> moves, 10 rounds",
    "stag_hunt_v0": "iterated stag hunt, <A>/<B> moves, 10 rounds",
    "chicken_v0": "iterated chicken, <A>/<B> moves, 10 rounds",
    "split_v0": "no-press Split: divide hats/books/balls by simultaneous <propose>",
    "trust_and_split_v0": "Trust-and-Split: one <message> each, then <propose>; variant=classic|rps",
    "tictactoe_v0": "two-player tic-tac-toe (AEC), <move>",
}


def load(name: str) -> ModuleType:
    """The game module ``rl_llm.envs.social.<name>``."""
    if name not in GAMES:
        raise ValueError(f"unknown social game {name!r}; choose from {sorted(GAMES)}")
    return importlib.import_module(f"rl_llm.envs.social.{name}")


__all__ = ["GAMES", "load"]
