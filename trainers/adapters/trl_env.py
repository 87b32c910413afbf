"""Deprecated alias of ``rl_llm.integrations.trl_env`` (see this package's docstring)."""

import sys

from rl_llm.integrations import trl_env as _moved

sys.modules[__name__] = _moved
