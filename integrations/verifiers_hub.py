"""rl-llm environments as Environments Hub packages, for verifiers 0.4 and 0.2 alike.

verifiers loads an environment by a top-level module name (``vf-eval rl-llm-tic-tac-toe``; the Hub installs
``owner/rl-llm-tic-tac-toe`` as the distribution ``rl-llm-tic-tac-toe``, module ``rl_llm_tic_tac_toe``).
``write_hub_package(env_id, out_dir, **env_kwargs)`` writes one such package for any rl-llm env: a
``pyproject.toml`` depending on ``rl-llm[verifiers]``, a README, and a module that works with whichever
verifiers is installed (the version decides): under verifiers >= 0.4 it exports ``RLLMEnv`` (``RLLMGameEnv``
for a social game with both seats as agents) and a taskset bound to the env (``integrations/verifiers_v1.py``); under verifiers 0.2 it defines ``load_environment``
(the classic ``MultiTurnEnv`` of ``integrations/verifiers_env.py``); docs/verifiers.md#environments-hub-packages.
This module imports no verifiers::

    python -m rl_llm.integrations.verifiers_hub --env rl-llm/TicTacToe-v0 --out environments -k opponent=minimax
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from rl_llm.console import ArgumentParser
from rl_llm.integrations.generic import parse_kwarg_pairs
from rl_llm.integrations.social_seat import SOCIAL_PREFIX, make_env

_PACKAGE_INIT = '''"""{env_id} from rl-llm as a verifiers environment (written by rl_llm.integrations.verifiers_hub).

verifiers >= 0.4 loads the taskset and env below by this module's name; verifiers 0.2 calls
``load_environment`` (the classic MultiTurnEnv adapter). The installed verifiers decides.
"""

import json

import verifiers

ENV_ID = {env_id!r}
ENV_KWARGS = json.loads({kwargs_json!r})

if hasattr(verifiers, "MultiTurnEnv"):  # verifiers 0.2: the classic API
    from rl_llm.integrations.verifiers_env import load_environment as _load

    def load_environment(num_examples: int = 64, seed: int = 0, **env_kwargs):
        return _load(ENV_ID, num_examples=num_examples, seed=seed, **{{**ENV_KWARGS, **env_kwargs}})

    __all__ = ["load_environment"]
else:
    from rl_llm.integrations.verifiers_v1 import {env_class}, RLLMTaskset

    class {prefix}Taskset(RLLMTaskset):
        ENV_ID = ENV_ID
        ENV_KWARGS = ENV_KWARGS

    __all__ = ["{env_class}", "{prefix}Taskset"]
'''

_PACKAGE_PYPROJECT = """[project]
name = "{dash}"
version = "0.1.0"
description = "rl-llm's {env_id} as a verifiers environment"
requires-python = ">=3.10"
dependencies = ["rl-llm[verifiers]"]

[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[tool.setuptools]
packages = ["{package}"]
"""

_PACKAGE_README = """# {dash}

rl-llm's `{env_id}` (kwargs `{kwargs_json}`) as a verifiers environment: one task per seed, the env plays the
user, the reward (`rl_llm_return`) is the episode's return in the env.

```bash
pip install -e .
vf-eval {dash} -n 8 -r 2 --model MODEL --client.base-url http://localhost:8000/v1 --no-push
```

Knobs: `--env.taskset.num-tasks`, `--env.taskset.seed`, `--env.taskset.env-kwargs '{{...}}'`.
"""


def hub_name(env_id: str) -> str:
    """``rl-llm/TicTacToe-v0`` -> ``rl-llm-tic-tac-toe``; ``social/prisoners_dilemma_v0`` -> ``rl-llm-prisoners-dilemma``."""
    name = env_id.split("/", 1)[-1]
    name = re.sub(r"[-_]v\d+$", "", name)
    name = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "-", name) if name != name.lower() else name
    return "rl-llm-" + re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def write_hub_package(env_id: str, out_dir: str | Path, name: str | None = None, **env_kwargs: Any) -> Path:
    """Write an Environments Hub package for ``env_id`` (with ``env_kwargs`` as its defaults) under
    ``out_dir``: ``<package>/pyproject.toml``, ``README.md`` and the module. Returns the package folder."""
    make_env(env_id, **env_kwargs).close()  # an unknown id or bad kwargs fail here, not at eval time
    dash = name or hub_name(env_id)
    if not re.fullmatch(r"[a-z][a-z0-9-]*", dash):
        raise ValueError(f"a package name is lowercase letters, digits and '-': got {dash!r}")
    package = dash.replace("-", "_")
    prefix = "".join(part.capitalize() for part in package.split("_"))
    kwargs_json = json.dumps(env_kwargs, sort_keys=True)
    root = Path(out_dir) / package
    (root / package).mkdir(parents=True, exist_ok=True)
    # A social game without a baseline opponent: both seats are agents (verifiers' multi-agent env).
    two_agents = env_id.startswith(SOCIAL_PREFIX) and "opponent" not in env_kwargs
    fields = {"env_id": env_id, "dash": dash, "package": package, "prefix": prefix, "kwargs_json": kwargs_json,
              "env_class": "RLLMGameEnv" if two_agents else "RLLMEnv"}  # fmt: skip
    (root / "pyproject.toml").write_text(_PACKAGE_PYPROJECT.format(**fields), encoding="utf-8")
    (root / "README.md").write_text(_PACKAGE_README.format(**fields), encoding="utf-8")
    (root / package / "__init__.py").write_text(_PACKAGE_INIT.format(**fields), encoding="utf-8")
    return root


def all_env_ids() -> list[str]:
    """Every registered rl-llm env id and every social game (as ``social/<game>``, one seat)."""
    from rl_llm.envs.registration import env_ids
    from rl_llm.envs.social import GAMES
    from rl_llm.integrations.social_seat import SOCIAL_PREFIX

    return [*env_ids(), *(SOCIAL_PREFIX + game for game in sorted(GAMES))]


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description="Write Environments Hub packages for rl-llm envs.")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--env", help="env id, e.g. rl-llm/TicTacToe-v0 or social/<game>")
    which.add_argument("--all", action="store_true", help="one package per registered env and social game")
    parser.add_argument("--out", default="environments", help="folder to write the packages into")
    parser.add_argument("--name", help="package name (default: rl-llm-<env>); only with --env")
    parser.add_argument("-k", action="append", default=[], metavar="KEY=VALUE", help="env kwarg (JSON value)")
    args = parser.parse_args(argv)
    try:
        kwargs = parse_kwarg_pairs(args.k)
        if args.env:
            print(write_hub_package(args.env, args.out, args.name, **kwargs))
            return 0
        if args.name:
            raise ValueError("--name names one package: use it with --env")
    except (ValueError, TypeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    failed = 0
    for env_id in all_env_ids():
        try:
            print(write_hub_package(env_id, args.out, **kwargs))
        except Exception as error:  # an env that cannot be made here (a missing extra): say so, go on
            failed += 1
            print(f"skipped {env_id}: {str(error).splitlines()[0]}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
