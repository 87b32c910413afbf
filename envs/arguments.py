"""Alias of ``rl_llm.checks``, where the argument checks moved when every layer came to share them: an env
written against docs/writing-an-environment.md's earlier advice (``from rl_llm.envs import arguments``) keeps
working, with the same functions."""

import sys

from rl_llm import checks as _moved

sys.modules[__name__] = _moved
