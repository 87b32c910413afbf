"""Deprecated alias of ``rl_llm.integrations.verifiers_env`` (see this package's docstring)."""

import sys

from rl_llm.integrations import verifiers_env as _moved

sys.modules[__name__] = _moved
