"""Deprecated alias of ``rl_llm.integrations.openenv`` (see this package's docstring)."""

import sys
import warnings

from rl_llm.integrations import openenv as _moved

if __name__ == "__main__":  # ``python -m rl_llm.trainers.adapters.openenv`` keeps working
    warnings.warn("run python -m rl_llm.integrations.openenv (rl_llm.trainers.adapters moved)", DeprecationWarning, stacklevel=1)
    _moved.main()
else:
    sys.modules[__name__] = _moved
