"""Iterated game of chicken (PettingZoo module: ``parallel_env()``, ``env()`` for AEC, ``raw_env``)."""

from __future__ import annotations

from typing import Any, ClassVar

from rl_llm.envs.social.base import module_constructors
from rl_llm.envs.social.matrix_game import MatrixGameEnv, Payoffs

PAYOFFS = Payoffs(reward=3, sucker=1, temptation=5, punishment=0)


class raw_env(MatrixGameEnv):  # lower-case: PettingZoo's module convention
    """
    ## Description
    Two players play chicken for ``num_rounds`` rounds: ``A`` is swerving, ``B`` is driving straight on.
    Straight on against a swerver pays best, but both going straight is the worst outcome for both.
    The prompt uses the neutral labels A and B.

    ## Observation, Action, Episode End, Info
    As in ``prisoners_dilemma_v0``: text with the rules once and a result line per round; a reply with
    the last ``<A>``/``<B>`` as the move; ``max_retries`` invalid retries in a row play ``default_action`` (B).

    ## Rewards
    Per round: both A 3/3, both B 0/0, A against B 1 / 5 (R=3, S=1, T=5, P=0).

    ## Arguments
    - ``payoffs`` (3, 1, 5, 0), ``num_rounds`` (10), ``max_retries`` (2), ``default_action`` ("B"),
      ``render_mode``.

    ## Version History
    - v0: initial release.
    """

    metadata: ClassVar[dict[str, Any]] = {**MatrixGameEnv.metadata, "name": "chicken_v0"}
    default_payoffs = PAYOFFS


parallel_env, env = module_constructors(raw_env)
