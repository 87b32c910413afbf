"""Benchmark suites: named, versioned YAML files that fix every environment, its kwargs, seeds and episodes.

A suite file (``agents/suites/<name>-v<version>.yaml``, or any path)::

    name: smoke
    version: 1
    description: one line
    seed: 0                      # default first seed of every entry
    envs:
      - key: bandit-5arm         # unique within the suite; the row name in results
        env: rl-llm/MultiArmedBandit-v0
        kwargs: {num_arms: 5, horizon: 10}
        episodes: 4              # seeds seed .. seed+episodes-1
        success: null            # metric that marks a solved episode (>= 1), if the env has one
        reference: oracle        # the agent scored 1.0 (default: oracle, else the best baseline)
      - key: prisoners-dilemma
        env: prisoners_dilemma_v0  # a two-player game: the agent plays every opponent in both seats
        kwargs: {num_rounds: 5}
        episodes: 2              # seeds per opponent and seat
        opponents: [random, tit_for_tat]  # default: every baseline of the game

Two people who run the same suite version face the same tasks, so their scores compare. Change a shipped
suite only by adding a new version.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rl_llm.paths import load_yaml, yaml_problem

SUITES_DIR = Path(__file__).resolve().parent.parent / "suites"


@dataclass(frozen=True)
class SuiteEnv:
    key: str
    env: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    episodes: int = 10
    seed: int = 0
    success: str | None = None
    reference: str | None = None
    opponents: tuple[str, ...] | None = None

    @property
    def is_game(self) -> bool:
        from rl_llm.envs.social import GAMES

        return self.env in GAMES

    @property
    def seeds(self) -> list[int]:
        return list(range(self.seed, self.seed + self.episodes))

    def digest(self) -> str:
        """Identifies this entry's tasks and settings (reference scores are cached under it)."""
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True, default=list).encode()).hexdigest()[
            :16
        ]


@dataclass(frozen=True)
class Suite:
    name: str
    version: int
    envs: tuple[SuiteEnv, ...]
    description: str = ""

    @property
    def id(self) -> str:
        return f"{self.name}-v{self.version}"

    def env(self, key: str) -> SuiteEnv:
        return next(entry for entry in self.envs if entry.key == key)


def available_suites() -> list[str]:
    return sorted(path.stem for path in SUITES_DIR.glob("*.yaml"))


def load_suite(name_or_path: str) -> Suite:
    """A shipped suite by id (``smoke-v1``) or a YAML file path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = SUITES_DIR / f"{name_or_path}.yaml"
        if not path.exists():
            raise ValueError(
                f"unknown suite {name_or_path!r}; shipped suites: {', '.join(available_suites())}"
            )
    try:
        data = load_yaml(path.read_text(encoding="utf-8"))  # a repeated key is an error, not last-wins
    except yaml.YAMLError as error:  # no ValueError: a traceback before
        raise ValueError(f"{path}: not a suite YAML file ({yaml_problem(error)})") from None
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not a suite YAML file ({error})") from None
    return parse_suite(data, source=str(path))


def parse_suite(data: dict[str, Any], source: str = "suite") -> Suite:
    if not isinstance(data, dict) or not {"name", "version", "envs"} <= set(data):
        raise ValueError(f"{source}: a suite needs name, version and envs")
    if not isinstance(data["envs"], list) or not all(isinstance(raw, dict) and {"key", "env"} <= set(raw)
                                                     for raw in data["envs"]):
        raise ValueError(f"{source}: envs must be a list of mappings, each with a key and an env")
    try:
        return _parse_suite(data, source)
    except (TypeError, ValueError) as error:  # int("ten"), dict([1]): name the file, whatever the field
        message = str(error)
        raise ValueError(message if message.startswith(source) else f"{source}: {message}") from None


def _parse_suite(data: dict[str, Any], source: str) -> Suite:
    from rl_llm.agents.baselines import baselines_for
    from rl_llm.envs.registration import env_ids
    from rl_llm.envs.social import GAMES

    base_seed = int(data.get("seed", 0))
    entries = []
    for raw in data["envs"]:
        known = {"key", "env", "kwargs", "episodes", "seed", "success", "reference", "opponents"}
        if unknown := set(raw) - known:
            raise ValueError(f"{source}: unknown field(s) {sorted(unknown)} in {raw.get('key', raw)}")
        opponents = raw.get("opponents")
        entry = SuiteEnv(
            key=str(raw["key"]),
            env=str(raw["env"]),
            kwargs=dict(raw.get("kwargs") or {}),
            episodes=int(raw.get("episodes", 10)),
            seed=int(raw.get("seed", base_seed)),
            success=raw.get("success"),
            reference=raw.get("reference"),
            opponents=tuple(opponents) if opponents else None,
        )
        if entry.env not in env_ids() and entry.env not in GAMES:
            raise ValueError(f"{source}: {entry.key}: unknown environment {entry.env!r}")
        baselines = baselines_for(entry.env)
        needed = ["random", *([entry.reference] if entry.reference else []), *(entry.opponents or ())]
        if missing := [name for name in needed if name not in baselines]:
            raise ValueError(f"{source}: {entry.key}: {entry.env} has no baseline(s) {missing}")
        if entry.episodes < 1:
            raise ValueError(f"{source}: {entry.key}: episodes must be at least 1")
        entries.append(entry)
    keys = [entry.key for entry in entries]
    if len(set(keys)) != len(keys):
        raise ValueError(f"{source}: duplicate env keys")
    return Suite(str(data["name"]), int(data["version"]), tuple(entries), str(data.get("description", "")))
