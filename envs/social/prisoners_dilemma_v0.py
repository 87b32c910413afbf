"""Iterated prisoner's dilemma (PettingZoo module: ``parallel_env()``, ``env()`` for AEC, ``raw_env``)."""

from __future__ import annotations

from typing import Any, ClassVar

from rl_llm.envs.social.base import module_constructors
from rl_llm.envs.social.matrix_game import MatrixGameEnv, Payoffs

PAYOFFS = Payoffs(reward=3, sucker=0, temptation=5, punishment=1)


class raw_env(MatrixGameEnv):  # lower-case: PettingZoo's module convention
    """
    ## Description
    Two players play the prisoner's dilemma for ``num_rounds`` rounds (protocol of "Learning Robust Social
    Strategies with LLMs"). ``A`` is cooperate and ``B`` is defect, but the prompt uses the neutral labels.
    Agents are ``player_0`` and ``player_1``; each round both act at the same time.

    ## Observation
    Text per agent: the rules and payoff table once, then after each round a line
    ``Round r result: you played A, the other player played B. You scored 0 points, the other player scored 5.``
    and the next prompt on the last line. Empty once the game is over.

    ## Action
    A reply ending in ``<A>`` or ``<B>``: free reasoning may come first, and the last ``<A>``/``<B>`` in the
    reply is the move (no stop strings, so a tag merely mentioned while thinking commits nothing). A reply
    without either tag is invalid: the agent is told why and tries again while the other player's move stays locked in; after
    ``max_retries`` invalid retries in a row ``default_action`` (``B``, defect) is played for it.
    ``max_retries=0`` reproduces the paper's rule that anything else counts as defect.

    ## Rewards
    Per round, from the payoff table: both A 3/3, both B 1/1, A against B 0 (sucker) / 5 (temptation).

    ## Episode End
    Terminated for both agents after ``num_rounds`` rounds; never truncated (each round ends within
    ``max_retries + 1`` steps).

    ## Info
    ``task_id``, ``seed``, ``round``, ``phase``, ``active`` (whether the agent's next action is read),
    ``invalid_action``, ``metrics`` (``return``, ``rounds``, ``cooperation_rate``, ``invalid_actions``,
    ``default_actions``); on reset also ``system_prompt`` and ``stop``.

    ## Arguments
    - ``payoffs`` (R=3, S=0, T=5, P=1): a ``Payoffs`` or four numbers ``(R, S, T, P)``.
    - ``num_rounds`` (10), ``max_retries`` (2), ``default_action`` ("B"), ``render_mode`` (None, "ansi", "human").

    ## Version History
    - v0: initial release. The move is the last tag of the reply and there are no stop strings (the
      earlier ``<A>``/``<B>`` stop strings committed a move at its first mention).
    """

    metadata: ClassVar[dict[str, Any]] = {**MatrixGameEnv.metadata, "name": "prisoners_dilemma_v0"}
    default_payoffs = PAYOFFS


parallel_env, env = module_constructors(raw_env)
