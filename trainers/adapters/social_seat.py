"""Deprecated alias of ``rl_llm.integrations.social_seat`` (see this package's docstring)."""

import sys

from rl_llm.integrations import social_seat as _moved

sys.modules[__name__] = _moved
