"""Deprecated alias of ``rl_llm.integrations.generic`` (see this package's docstring)."""

import sys

from rl_llm.integrations import generic as _moved

sys.modules[__name__] = _moved
