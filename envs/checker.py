"""``check_text_env``: the environment contract as a function, for every env and for the ones you write.

Like Gymnasium's ``gymnasium.utils.env_checker.check_env`` and PettingZoo's ``api_test``, it plays an env and
raises :class:`EnvContractError` at the first broken rule, naming the rule. The rules are those of
docs/design.md#the-environment-contract; docs/writing-an-environment.md shows how to write an env that
passes. Gymnasium's own ``check_env`` runs too, as one more rule (``gymnasium-check-env``).

The fuzz is bounded and deterministic: a few episodes of hostile actions (arbitrary Unicode, control
characters, tag soup built from the env's own stop strings, a megabyte-long action) drawn from ``seed``, so a
failure reproduces with the same call. ``check_episode`` checks one episode of actions you choose (the test
suite feeds it hypothesis-drawn actions).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from rl_llm.errors import RLLMError

__all__ = ["RULES", "EnvContractError", "check_episode", "check_text_env", "hostile_actions"]

#: Every rule the checker enforces, by the name its errors carry.
RULES: dict[str, str] = {
    "reset-returns-text-and-info": "reset() returns (observation: non-empty str, info: dict)",
    "reset-info-keys": "reset info holds system_prompt (non-empty str), task_id (non-empty str) and stop "
    "(a list of str)",
    "reset-deterministic": "the same seed and options give the same task_id and first observation",
    "step-returns-five-tuple": "step() returns (observation: str, reward: float, terminated: bool, "
    "truncated: bool, info: dict)",
    "step-info-keys": "step info holds reward_components (dict of named floats), invalid_action (bool) and "
    "metrics (dict)",
    "reward-finite": "the reward is a finite float",
    "reward-components-sum": "the reward components sum to the reward",
    "invalid-action-continues": "an invalid action never ends the episode by itself: one right after reset "
    "does not terminate it (later ones may reach max_turns, then truncated, or a game's own limit)",
    "corrective-observation": "an invalid action that does not end the episode gets a non-empty corrective "
    "observation",
    "empty-observation-at-end": "the observation is '' on the step that ends the episode",
    "ends-within-max-turns": "every episode ends (terminated or truncated) within max_turns steps",
    "step-after-end-raises": "step() after the episode ended raises (call reset first)",
    "text-actions-only": "step() refuses an action that is not a str with TypeError",
    "spaces-accept-any-text": "the action and observation spaces contain any Unicode string (UnicodeText)",
    "same-seed-same-episode": "the same seed, options and actions give the same observations, rewards and "
    "ends",
    "render-returns-transcript": "render() returns the episode's transcript as text, every action included",
    "survives-hostile-actions": "no action, however malformed or long, makes step() raise",
    "gymnasium-check-env": "gymnasium.utils.env_checker.check_env passes",
}

# Tags of the bundled envs (complete, unclosed, nested, misspelled); the env's own stop strings join them.
_TAGS = ("answer", "search", "sql", "solution", "command", "action", "move", "python", "think", "tool_call")
_FRAGMENTS = (
    *(f"{pre}{tag}{post}" for tag in _TAGS for pre, post in (("<", ">"), ("</", ">"), ("<", ""))),
    "<<", ">>", "<>", "</>", "<answer>42</answer>", "<action>done</action>", '{"name": "x", "arguments": {}}',
    "\\boxed{", "}", "\x00", "\x1b[31m", "\ufeff", "\u202e", "\r\n", "\t", "SELECT 1", "ls", "é", "中", "🤖",
)  # fmt: skip
# Code point ranges for arbitrary Unicode (no lone surrogates: no decoder yields them).
_CODE_POINTS = (
    (0x00, 0x1F), (0x20, 0x7E), (0x7F, 0x9F), (0xA0, 0x2FF), (0x300, 0x36F), (0x590, 0x6FF), (0x200B, 0x200F),
    (0x202A, 0x202E), (0x4E00, 0x9FFF), (0xFEFF, 0xFEFF), (0xFFF0, 0xFFFF), (0x1F300, 0x1FAFF), (0xE0000, 0xE007F),
)  # fmt: skip
# Clearly not an action in any env: probed right after reset for the invalid-action rules.
_PROBES = ("", "\x00", "</>< not an action >")
MEGABYTE = 1 << 20


class EnvContractError(RLLMError, AssertionError):
    """An environment broke a rule of the contract; ``rule`` is its name (a key of ``RULES``)."""

    def __init__(self, rule: str, env: gym.Env | None, detail: str) -> None:
        self.rule = rule
        super().__init__(f"[{rule}] {_name(env)}: {detail} (rule: {RULES[rule]})")


def check_text_env(
    env: gym.Env,
    *,
    seed: int = 0,
    options: dict[str, Any] | None = None,
    fuzz_episodes: int = 3,
    max_turns: int | None = None,
    skip_render_check: bool = False,
) -> None:
    """Check that ``env`` follows the rl-llm environment contract; raise :class:`EnvContractError` if not.

    ``seed`` seeds every episode the checker plays and the hostile actions it draws; ``options`` go to every
    ``reset``. ``fuzz_episodes`` episodes of hostile actions are played (the first opens with a megabyte-long
    action); 0 skips the fuzz. ``max_turns`` is the turn limit every episode must respect (default: the env's
    ``max_turns``, the outermost wrapper's that has one, else 1000). ``skip_render_check`` is passed to
    Gymnasium's ``check_env``, which runs last on ``env.unwrapped``; for a single-turn env (a turn limit of 1)
    its complaint that the env "truncates after 1 step" is waived: the contract truncates an invalid single
    turn. The env is reset and stepped; close it afterwards.
    """
    limit = _turn_limit(env, max_turns)
    observation, info = _reset(env, seed, options)
    again, again_info = _reset(env, seed, options)
    for what, before, after in (("task_id", info["task_id"], again_info["task_id"]),
                                ("first observation", observation, again)):  # fmt: skip
        if before != after:
            raise EnvContractError("reset-deterministic", env, f"reset(seed={seed}) twice gave a different {what}: "
                                   f"{_short(before)} then {_short(after)}")  # fmt: skip
    _check_spaces(env, [observation, *_PROBES, *hostile_actions(seed, count=6, stop=info["stop"])])
    _check_text_actions_only(env, seed, options)

    # An invalid action right after reset (actions no env takes for a valid turn) must not end the episode.
    for probe in _PROBES:
        _reset(env, seed, options)
        result = _step(env, probe)
        if result.info["invalid_action"] and result.terminated:
            raise EnvContractError("invalid-action-continues", env,
                                   f"step({probe!r}) right after reset was flagged invalid_action and ended the "
                                   "episode (terminated)")  # fmt: skip

    # Determinism of a whole episode, and the transcript behind render().
    plain = [*_PROBES, "<answer>42</answer>", *info["stop"]]
    first = _play(env, plain, seed=seed, options=options, limit=limit)
    if env.render_mode != "human":
        _check_render(env, first)
    second = _play(env, plain, seed=seed, options=options, limit=limit)
    first_keys, second_keys = [step.key() for step in first], [step.key() for step in second]
    if first_keys != second_keys:
        turn = next((i for i, (a, b) in enumerate(zip(first_keys, second_keys)) if a != b),
                    min(len(first_keys), len(second_keys)))
        raise EnvContractError("same-seed-same-episode", env,
                               f"two episodes with seed={seed} and the same actions differ at turn {turn + 1}")  # fmt: skip

    # Bounded deterministic fuzz.
    for episode in range(fuzz_episodes):
        actions = hostile_actions(seed + episode, count=min(limit, 16), stop=info["stop"])
        if episode == 0:
            actions[0] = _megabyte_action(seed, info["stop"], env.action_space)
        _play(env, actions, seed=seed + 1 + episode, options=options, limit=limit)

    from gymnasium.utils.env_checker import check_env

    try:
        check_env(env.unwrapped, skip_render_check=skip_render_check)
    except AssertionError as error:
        # A single-turn env truncates its one turn when the action (a random sample) is invalid: the contract
        # asks for that, Gymnasium's step check calls it broken. Only that check is waived, only then.
        if not (_turn_limit(env.unwrapped, None) == 1 and "truncates after 1 step" in str(error)):
            raise EnvContractError("gymnasium-check-env", env, str(error)) from error


def check_episode(
    env: gym.Env,
    actions: Sequence[str],
    *,
    seed: int | None = None,
    options: dict[str, Any] | None = None,
    max_turns: int | None = None,
) -> None:
    """Reset ``env`` and play ``actions`` (cycled) until the episode ends, checking every step and the end
    against the contract: what ``check_text_env``'s fuzz does for each episode."""
    if not actions:
        raise ValueError("check_episode needs at least one action")
    _play(env, list(actions), seed=seed, options=options, limit=_turn_limit(env, max_turns))


def hostile_actions(seed: int, count: int = 8, stop: Sequence[str] = ()) -> list[str]:
    """``count`` hostile LLM turns drawn from ``seed``: arbitrary Unicode, tag soup (with the ``stop``
    strings), near-empty strings, and long (16 to 128 KiB) tag soup."""
    rng = np.random.default_rng(seed)
    fragments = list(_FRAGMENTS) + [s for s in stop if s] + [s.replace("</", "<") for s in stop if s]
    kinds = ("unicode", "tags", "tags", "empty", "long")
    actions = []
    for i in range(count):
        kind = kinds[i % len(kinds)] if i < len(kinds) else kinds[int(rng.integers(len(kinds)))]
        if kind == "empty":
            actions.append(str(rng.choice(["", " ", "\n", "\x00", "\r\n\t", "\u200b"])))
        elif kind == "unicode":
            actions.append(_random_unicode(rng, int(rng.integers(1, 300))))
        else:
            parts = [fragments[int(j)] for j in rng.integers(len(fragments), size=int(rng.integers(1, 30)))]
            parts.insert(int(rng.integers(len(parts) + 1)), _random_unicode(rng, int(rng.integers(0, 12))))
            text = "".join(parts)
            if kind == "long":  # 16 to 128 KiB
                text = text * (int(rng.integers(1 << 14, 1 << 17)) // max(len(text), 1) + 1)
            actions.append(text)
    return actions


# -- the checks ------------------------------------------------------------------------------------------


@dataclass
class _Step:
    action: str
    observation: str
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]

    def key(self) -> tuple:
        components = sorted((str(k), float(v)) for k, v in self.info["reward_components"].items())
        return (self.observation, self.reward, self.terminated, self.truncated, bool(self.info["invalid_action"]),
                components)  # fmt: skip


def _turn_limit(env: gym.Env, max_turns: int | None) -> int:
    """``max_turns`` if given, else the outermost ``max_turns`` of the wrapper chain (a wrapper such as
    ``TryAgain`` allows more turns than the env it wraps), else 1000."""
    if max_turns is not None:
        return max_turns
    try:
        limit = env.get_wrapper_attr("max_turns")
    except AttributeError:
        limit = None
    return limit if isinstance(limit, int) and limit >= 1 else 1000


def _name(env: gym.Env | None) -> str:
    """``TryAgain(MathEnv)``: the env's class inside the classes of its wrappers."""
    if env is None:
        return "env"
    names = []
    while isinstance(env, gym.Wrapper):
        names.append(type(env).__name__)
        env = env.env
    return "".join(f"{name}(" for name in names) + type(env).__name__ + ")" * len(names)


def _reset(env: gym.Env, seed: int | None, options: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
    try:
        result = env.reset(seed=seed, options=None if options is None else dict(options))
    except Exception as error:
        raise EnvContractError("reset-returns-text-and-info", env,
                               f"reset(seed={seed}) raised {type(error).__name__}: {error}") from error  # fmt: skip
    if not (isinstance(result, tuple) and len(result) == 2):
        raise EnvContractError("reset-returns-text-and-info", env, f"reset() returned {_short(result)}")
    observation, info = result
    if not isinstance(observation, str) or not observation:
        raise EnvContractError("reset-returns-text-and-info", env,
                               f"the first observation must be a non-empty str, got {_short(observation)}")  # fmt: skip
    if not isinstance(info, dict):
        raise EnvContractError("reset-returns-text-and-info", env, f"info must be a dict, got {type(info).__name__}")
    for key in ("system_prompt", "task_id"):
        if not isinstance(info.get(key), str) or not info[key]:
            raise EnvContractError("reset-info-keys", env,
                                   f"info[{key!r}] must be a non-empty str, got {_short(info.get(key, '<missing>'))}")  # fmt: skip
    stop = info.get("stop")
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop):
        raise EnvContractError("reset-info-keys", env,
                               f"info['stop'] must be a list of str, got {_short(stop if 'stop' in info else '<missing>')}")  # fmt: skip
    return observation, info


def _step(env: gym.Env, action: str) -> _Step:
    try:
        result = env.step(action)
    except Exception as error:
        raise EnvContractError("survives-hostile-actions", env,
                               f"step({_short(action)}) raised {type(error).__name__}: {error}") from error  # fmt: skip
    if not (isinstance(result, tuple) and len(result) == 5):
        raise EnvContractError("step-returns-five-tuple", env, f"step() returned {_short(result)}")
    observation, reward, terminated, truncated, info = result
    for name, value, kind in (("observation", observation, str), ("reward", reward, float),
                              ("terminated", terminated, (bool, np.bool_)), ("truncated", truncated, (bool, np.bool_)),
                              ("info", info, dict)):  # fmt: skip
        if not isinstance(value, kind) or (kind is float and isinstance(value, bool)):
            raise EnvContractError("step-returns-five-tuple", env,
                                   f"{name} must be {getattr(kind, '__name__', 'bool')}, got {type(value).__name__}")  # fmt: skip
    if not math.isfinite(reward):
        raise EnvContractError("reward-finite", env, f"step({_short(action)}) gave reward {reward}")
    components = info.get("reward_components")
    if not isinstance(components, Mapping) or not all(
        isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) for k, v in components.items()
    ):
        raise EnvContractError("step-info-keys", env,
                               f"info['reward_components'] must be a dict of str to float, got {_short(components)}")  # fmt: skip
    if not isinstance(info.get("invalid_action"), (bool, np.bool_)):
        raise EnvContractError("step-info-keys", env,
                               f"info['invalid_action'] must be a bool, got {_short(info.get('invalid_action', '<missing>'))}")  # fmt: skip
    if not isinstance(info.get("metrics"), Mapping):
        raise EnvContractError("step-info-keys", env,
                               f"info['metrics'] must be a dict, got {_short(info.get('metrics', '<missing>'))}")  # fmt: skip
    total = sum(float(v) for v in components.values())
    if not math.isclose(reward, total, rel_tol=1e-9, abs_tol=1e-9):
        raise EnvContractError("reward-components-sum", env,
                               f"reward {reward!r} but the components {dict(components)} sum to {total!r}")  # fmt: skip
    ended = bool(terminated or truncated)
    if ended and observation != "":
        raise EnvContractError("empty-observation-at-end", env,
                               f"the episode ended with observation {_short(observation)}")  # fmt: skip
    if info["invalid_action"] and not ended and not observation.strip():
        raise EnvContractError("corrective-observation", env,
                               f"step({_short(action)}) was invalid but the observation is {observation!r}")  # fmt: skip
    return _Step(action, observation, float(reward), bool(terminated), bool(truncated), info)


def _play(env: gym.Env, actions: list[str], *, seed: int | None, options: dict[str, Any] | None,
          limit: int) -> list[_Step]:  # fmt: skip
    _reset(env, seed, options)
    steps: list[_Step] = []
    while not steps or not (steps[-1].terminated or steps[-1].truncated):
        if len(steps) == limit:
            raise EnvContractError("ends-within-max-turns", env, f"the episode did not end within max_turns={limit}")
        steps.append(_step(env, actions[len(steps) % len(actions)]))
    try:
        env.step("after the end")
    except Exception:
        pass
    else:
        raise EnvContractError("step-after-end-raises", env, "step() after the episode ended returned normally")
    return steps


def _check_spaces(env: gym.Env, texts: list[str]) -> None:
    for name in ("action_space", "observation_space"):
        space = getattr(env, name)
        for text in texts:
            if not space.contains(text):
                raise EnvContractError("spaces-accept-any-text", env,
                                       f"{name} {space} does not contain {_short(text)}: use rl_llm.envs.UnicodeText")  # fmt: skip


def _check_text_actions_only(env: gym.Env, seed: int, options: dict[str, Any] | None) -> None:
    _reset(env, seed, options)
    for action in (123, None, [1, 2, 3]):
        try:
            env.unwrapped.step(action)
        except TypeError:
            continue
        except Exception as error:
            raise EnvContractError("text-actions-only", env,
                                   f"step({action!r}) raised {type(error).__name__}, not TypeError: {error}") from error  # fmt: skip
        raise EnvContractError("text-actions-only", env, f"step({action!r}) was accepted")


def _check_render(env: gym.Env, steps: list[_Step]) -> None:
    try:
        transcript = env.render()
    except Exception as error:
        raise EnvContractError("render-returns-transcript", env,
                               f"render() raised {type(error).__name__}: {error}") from error  # fmt: skip
    if not isinstance(transcript, str) or not transcript:
        raise EnvContractError("render-returns-transcript", env, f"render() returned {_short(transcript)}")
    missing = [step.action for step in steps if step.action not in transcript]
    if missing:
        raise EnvContractError("render-returns-transcript", env,
                               f"the transcript lacks the action {_short(missing[0])}")  # fmt: skip


def _megabyte_action(seed: int, stop: Sequence[str], space: gym.Space) -> str:
    size = min(MEGABYTE, getattr(space, "max_length", MEGABYTE))
    soup = "".join(hostile_actions(seed, count=4, stop=stop)[1:4]) or "<answer>"
    return (soup * (size // len(soup) + 1))[:size]


def _random_unicode(rng: np.random.Generator, length: int) -> str:
    ranges = [_CODE_POINTS[int(i)] for i in rng.integers(len(_CODE_POINTS), size=length)]
    return "".join(chr(int(rng.integers(low, high + 1))) for low, high in ranges)


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"
