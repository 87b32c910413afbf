"""Deprecated: ``rl_llm.trainers.adapters`` moved to ``rl_llm.integrations`` (docs/design.md#integrations).

Every old import path keeps working: ``rl_llm.trainers.adapters.<module>`` is the very module object
``rl_llm.integrations.<module>`` (so ``isinstance`` checks and module state agree), and
``python -m rl_llm.trainers.adapters.http_server`` / ``.openenv`` still start their servers. Each warns once.
"""

import warnings

from rl_llm.integrations import EnvFactory, MessageEnv

warnings.warn(
    "rl_llm.trainers.adapters moved to rl_llm.integrations; import from there (the old path will be removed)",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["EnvFactory", "MessageEnv"]
