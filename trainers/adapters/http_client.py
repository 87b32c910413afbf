"""Deprecated alias of ``rl_llm.integrations.http_client`` (see this package's docstring)."""

import sys

from rl_llm.integrations import http_client as _moved

sys.modules[__name__] = _moved
