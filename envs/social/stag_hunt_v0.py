"""Iterated stag hunt (PettingZoo module: ``parallel_env()``, ``env()`` for AEC, ``raw_env``)."""

from __future__ import annotations

from typing import Any, ClassVar

from rl_llm.envs.social.base import module_constructors
from rl_llm.envs.social.matrix_game import MatrixGameEnv, Payoffs

PAYOFFS = Payoffs(reward=4, sucker=0, temptation=3, punishment=2)


class raw_env(MatrixGameEnv):  # lower-case: PettingZoo's module convention
    """
    ## Description
    Two players play the stag hunt for ``num_rounds`` rounds: ``A`` is hunting the stag (pays only if both
    do), ``B`` is hunting a hare (safe). Both A and both B are equilibria; A/A pays more, B is safer.
    The prompt uses the neutral labels A and B.

    ## Observation, Action, Episode End, Info
    As in ``prisoners_dilemma_v0``: text with the rules once and a result line per round; a reply with
    the last ``<A>``/``<B>`` as the move; ``max_retries`` invalid retries in a row play ``default_action`` (B).

    ## Rewards
    Per round: both A 4/4, both B 2/2, A against B 0 / 3 (R=4, S=0, T=3, P=2).

    ## Arguments
    - ``payoffs`` (4, 0, 3, 2), ``num_rounds`` (10), ``max_retries`` (2), ``default_action`` ("B"),
      ``render_mode``.

    ## Version History
    - v0: initial release.
    """

    metadata: ClassVar[dict[str, Any]] = {**MatrixGameEnv.metadata, "name": "stag_hunt_v0"}
    default_payoffs = PAYOFFS


parallel_env, env = module_constructors(raw_env)
