"""The package's root exception: every error rl-llm raises on purpose derives from ``RLLMError``.

Each specific class also keeps the built-in base it had (``ConfigError`` is still a ``ValueError``,
``SandboxError`` a ``RuntimeError``), so existing ``except`` clauses go on working. ``rl-llm`` (the CLI) catches
``RLLMError`` and prints its message on one ``error:`` line instead of a traceback; a library user can catch it to
tell rl-llm's own, explained failures from bugs.
"""

from __future__ import annotations


class RLLMError(Exception):
    """Base class of the errors rl-llm raises with a message meant for the user."""
