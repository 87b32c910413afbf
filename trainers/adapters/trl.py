"""Deprecated alias of ``rl_llm.integrations.trl`` (see this package's docstring)."""

import sys

from rl_llm.integrations import trl as _moved

sys.modules[__name__] = _moved
