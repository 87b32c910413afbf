"""Deprecated alias of ``rl_llm.integrations.verl`` (see this package's docstring)."""

import sys

from rl_llm.integrations import verl as _moved

sys.modules[__name__] = _moved
