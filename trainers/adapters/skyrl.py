"""Deprecated alias of ``rl_llm.integrations.skyrl`` (see this package's docstring)."""

import sys

from rl_llm.integrations import skyrl as _moved

sys.modules[__name__] = _moved
