"""Trainer-agnostic access to rl-llm environments: a picklable env factory and a message interface.

External RL frameworks differ in how they drive environments, but most reduce to two calls on chat messages
(SkyRL-gym's ``init``/``step``, OpenRLHF's agent ``reset``/``step``, verl's interactions)::

    env = MessageEnv(EnvFactory("rl-llm/TicTacToe-v0", opponent="minimax"))
    messages = env.reset({"seed": 3})                      # [system, user] as OpenAI-style dicts
    new_messages, reward, done, info = env.step(messages + [{"role": "assistant", "content": "<move>B2</move>"}])

``EnvFactory`` holds only the env id and JSON-like keyword arguments, so it pickles across processes, Ray
actors and HTTP requests; every worker builds its own env from it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym

from rl_llm.envs.registration import EnvFactory

MessageDict = dict[str, str]
#: What ``MessageEnv.reset`` accepts: None (unseeded), a seed, or ``{"seed", "options", "task_index"}``.
TaskSpec = int | Mapping[str, Any] | None
TASK_KEYS = frozenset({"seed", "options", "task_index"})


def parse_kwarg_pairs(pairs: Sequence[str]) -> dict[str, Any]:
    """``-k key=value`` pairs of the servers' and packagers' command lines -> env kwargs: ``["opponent=minimax",
    "max_turns=5"]`` -> ``{"opponent": "minimax", "max_turns": 5}`` (values as JSON when they parse, else
    strings). A pair without ``=`` or key is a ValueError."""
    kwargs: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"-k takes key=value, got {pair!r}")
        if key in kwargs:  # the last would win silently
            raise ValueError(f"-k {key} is given twice; give each key once")
        try:
            kwargs[key] = json.loads(value)
        except json.JSONDecodeError:
            kwargs[key] = value
    return kwargs


def checked_mapping(name: str, value: Any) -> dict[str, Any]:
    """``value`` (None: empty) as a dict: ``dict(["opponent"])`` failed as "dictionary update sequence element #0"."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"{name} must be a dict, got {type(value).__name__} {value!r}")
    return dict(value)


def parse_task(task: TaskSpec) -> tuple[int | None, dict[str, Any]]:
    """``(seed, options)`` from a task spec; a clear error for anything else."""
    if task is None:
        return None, {}
    if isinstance(task, bool) or not isinstance(task, (int, Mapping)):
        raise TypeError(f"a task is None, an int seed or a dict with keys {sorted(TASK_KEYS)}; got {task!r}")
    if isinstance(task, int):
        return task, {}
    unknown = set(task) - TASK_KEYS
    if unknown:
        raise ValueError(f"unknown task keys {sorted(unknown)}; allowed: {sorted(TASK_KEYS)}")
    seed = task.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise TypeError(f"task seed must be an int or None, got {seed!r}")
    options = task.get("options") or {}
    if not isinstance(options, Mapping):
        raise TypeError(f"task options must be a dict, got {type(options).__name__}")
    options = dict(options)
    if "task_index" in task:
        options["task_index"] = task["task_index"]
    return seed, options


def action_from(messages: str | Sequence[Mapping[str, Any]]) -> str:
    """The action text: the string itself, or the content of the last message, which must be the assistant's."""
    if isinstance(messages, str):
        return messages
    if not messages:
        raise ValueError("step needs the assistant's turn: got an empty message list")
    last = messages[-1]
    if not isinstance(last, Mapping) or last.get("role") != "assistant":
        raise ValueError("the last message passed to step must be the assistant's turn (role 'assistant')")
    content = last.get("content")
    if not isinstance(content, str):
        raise TypeError(f"the assistant message content must be a string, got {type(content).__name__}")
    return content


def step_info(terminated: bool, truncated: bool, info: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON-safe part of a step's info plus the Gymnasium end flags."""
    return {"terminated": terminated, "truncated": truncated, **jsonable(info if type(info) is dict else dict(info))}


_PLAIN = frozenset({str, bool, int, float, type(None)})


def jsonable(value: Any) -> Any:
    """``value`` with numpy scalars/arrays and tuples turned into plain JSON types (unknown objects -> repr)."""
    kind = type(value)  # exact-type fast paths first: the env servers run this on every step (docs/serving.md#inline-calls)
    if kind in _PLAIN:
        return value
    if kind is dict:
        # plain items are copied without a call: most of an info dict is numbers and strings
        return {key if type(key) is str else str(key): item if type(item) in _PLAIN else jsonable(item)
                for key, item in value.items()}  # fmt: skip
    if kind is list:
        return [item if type(item) in _PLAIN else jsonable(item) for item in value]
    if isinstance(value, Mapping):
        return {str(key): jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(item) for item in value]
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if hasattr(value, "tolist"):  # numpy arrays and scalars
        return jsonable(value.tolist())
    return repr(value)


class MessageEnv:
    """One rl-llm env behind a chat-message interface.

    ``reset(task) -> messages`` returns the opening conversation (system prompt + first observation).
    ``step(messages) -> (messages, reward, done, info)`` takes the conversation ending with the assistant's
    turn (or the turn's text alone) and returns the messages to append: one ``user`` message with the env's
    reply, or none once the episode is over. ``info`` carries ``terminated``, ``truncated``, ``task_id`` and
    the env's step info (``reward_components``, ``invalid_action``, ``metrics``). An exception from the env's
    own step ends the episode (``done``; ``reset`` starts the next one): a bad conversation, refused before the
    env sees it, does not.
    """

    def __init__(self, env: gym.Env | EnvFactory, observation_role: str = "user") -> None:
        self.env = env() if isinstance(env, EnvFactory) else env
        self.observation_role = observation_role
        self.task_id: str | None = None
        self.reset_info: dict[str, Any] = {}  # the JSON-safe info of the last reset (stop strings, ...)
        self.done = True

    def reset(self, task: TaskSpec = None) -> list[MessageDict]:
        seed, options = parse_task(task)
        observation, info = self.env.reset(seed=seed, options=options)
        self.task_id, self.done = info.get("task_id"), False
        self.reset_info = jsonable(info)
        return [{"role": "system", "content": info["system_prompt"]}, {"role": self.observation_role, "content": observation}]

    def step(self, messages: str | Sequence[Mapping[str, Any]]) -> tuple[list[MessageDict], float, bool, dict[str, Any]]:
        if self.done:
            raise RuntimeError("the episode has ended (or never started); call reset()")
        action = action_from(messages)  # the caller's input: a bad one is refused and the episode goes on
        try:
            observation, reward, terminated, truncated, info = self.env.step(action)
        except Exception:
            # the env failed mid-step, so its state is unknown: stepping it again would play on a broken episode
            self.done = True
            raise
        self.done = bool(terminated or truncated)
        new_messages = [] if self.done else [{"role": self.observation_role, "content": observation}]
        return new_messages, float(reward), self.done, {"task_id": self.task_id, **step_info(terminated, truncated, info)}

    def close(self) -> None:
        self.env.close()

    def __enter__(self) -> MessageEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

