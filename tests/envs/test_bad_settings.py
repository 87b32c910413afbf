"""Settings, reset options and data files that got past the envs' checks (found by a red-team sweep): each is a
ValueError naming the setting or the file now, when the env is made or reset, never a bare TypeError,
AttributeError or UnicodeDecodeError from deep inside, nor a reward of NaN or inf."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import rl_llm  # noqa: F401
from rl_llm.envs.retrieval.corpus import DataFormatError, load_corpus, load_qa
from rl_llm.envs.social import prisoners_dilemma_v0, split_v0, tictactoe_v0, trust_and_split_v0
from rl_llm.envs.terminal import generate_task
from rl_llm.envs.terminal.task import load_task_dir
from rl_llm.envs.terminal.terminal_env import TerminalEnv
from rl_llm.envs.wrappers.attempts import MultiAttempt, TryAgain

NAN, INF = math.nan, math.inf
MAKE = [
    # a NaN or infinite reward weight made every reward of the run NaN or inf; 3 was "'int' is not iterable"
    ("rl-llm/TextToSQL-v0", {"reward_weights": {"execution": NAN}}, r"reward_weights\['execution'\] must be a finite"),
    ("rl-llm/TextToSQL-v0", {"reward_weights": {"execution": INF}}, r"reward_weights\['execution'\] must be a finite"),
    ("rl-llm/TextToSQL-v0", {"reward_weights": {"execution": "1"}}, r"reward_weights\['execution'\] must be a finite"),
    ("rl-llm/TextToSQL-v0", {"reward_weights": 3}, "reward_weights must be a preset name or a"),
    # finite but huge: best - worst overflowed to inf, and the strategic reward was NaN
    ("rl-llm/MultiArmedBandit-v0", {"distribution": "gaussian", "num_arms": 2, "means": [1e308, -1e308]}, "^means must"),
    ("rl-llm/MultiArmedBandit-v0", {"distribution": "gaussian", "sigma": 1e308}, r"^sigma must be <= 1000000.0, got 1e\+308"),
    ("rl-llm/MultiArmedBandit-v0", {"invalid_action_penalty": 1e308}, r"^invalid_action_penalty must be in \[0.0, 1000000.0\]"),
    ("rl-llm/ContextualBandit-v0", {"noise": 1e308}, r"^noise must be in \[0.0, 1000000.0\]"),
    ("rl-llm/TicTacToe-v0", {"illegal_move_penalty": 1e300}, r"^illegal_move_penalty must be in"),
    # Search: hops=2 was "argument of type 'int' is not iterable", protocol=["x"] "unhashable type: 'list'"
    ("rl-llm/Search-v0", {"hops": 2}, "^hops must be a list of tool-call counts"),
    ("rl-llm/Search-v0", {"hops": [1, 2.5]}, r"^hops\[1\] must be an integer"),
    ("rl-llm/Search-v0", {"protocol": ["x"]}, "^protocol must be one of"),
    # Terminal: sandbox=None built and then failed at the first reset with an AttributeError
    ("rl-llm/Terminal-v0", {"sandbox": None}, "^sandbox must be 'auto', a backend name"),
    ("rl-llm/Terminal-v0", {"sandbox": 3}, "^sandbox must be 'auto', a backend name"),
    ("rl-llm/Terminal-v0", {"sandbox": "dockr"}, "^sandbox must be 'auto', a backend name"),
    ("rl-llm/Terminal-v0", {"sandbox_kwargs": "x"}, "^sandbox_kwargs must be a dict"),  # dict("x"): "update sequence"
    ("rl-llm/Terminal-v0", {"difficulty": True}, "^unknown difficulty"),  # was the task id ".../dTrue/0"
    ("rl-llm/Terminal-v0", {"difficulty": 2.0}, "^unknown difficulty"),  # was "'float' object is not iterable"
    ("rl-llm/Terminal-v0", {"difficulty": {1: 2}}, "^unknown difficulty"),
]  # fmt: skip


@pytest.mark.parametrize(("env_id", "kwargs", "message"), MAKE)
def test_a_bad_setting_is_refused_when_the_env_is_made(env_id: str, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        gym.make(env_id, **kwargs)


def test_settings_at_the_bounds_still_play_with_finite_rewards() -> None:
    env = gym.make("rl-llm/MultiArmedBandit-v0", distribution="gaussian", num_arms=2, reward_mode="strategic",
                   invalid_action_penalty=1e6)  # fmt: skip
    env.reset(seed=0, options={"means": [1e6, -1e6]})
    rewards = [env.step(action)[1] for action in ("<action>A</action>", "no arm")]
    assert rewards[0] == 1.0 and math.isfinite(rewards[1])
    weights = gym.make("rl-llm/TextToSQL-v0", reward_weights={"execution": 2, "syntax": 0}).unwrapped
    assert weights.weights == {"execution": 2.0}


def test_terminal_difficulty_takes_numpy_integers_and_names_tasks_alike() -> None:
    """np.int64(2) was taken for a sequence ("'numpy.int64' object is not iterable")."""
    assert TerminalEnv(difficulty=np.int64(2)).tasks[0].task_id == TerminalEnv(difficulty=2).tasks[0].task_id
    assert generate_task(0, difficulty=[np.int64(3)]).task_id.endswith("/d3/0")
    with pytest.raises(ValueError, match="unknown difficulty"):
        generate_task(0, difficulty=True)
    with pytest.raises(ValueError, match="unknown task family"):
        generate_task(0, family=5)


def test_terminal_tasks_must_be_a_folder_or_tasks() -> None:
    with pytest.raises(TypeError, match="tasks must be a folder path or a non-empty sequence"):
        TerminalEnv(tasks=123)  # was "'int' object is not iterable"


# -- task folders from outside: each problem names its file --------------------------------------------------
def _hand_written(root: Path, description: bytes = b"Create done.txt.", test: bytes = b"test -f done.txt\n") -> Path:
    root.mkdir(parents=True)
    (root / "description.md").write_bytes(description)
    (root / "test.sh").write_bytes(test)
    return root


def _harbor(root: Path, task_toml: str = "", dockerfile: str | None = None) -> Path:
    (root / "tests").mkdir(parents=True)
    (root / "instruction.md").write_text("Create /app/done.txt.")
    (root / "tests" / "test.sh").write_text("test -f /app/done.txt\n")
    (root / "task.toml").write_text(task_toml)
    if dockerfile is not None:
        (root / "environment").mkdir()
        (root / "environment" / "Dockerfile").write_text(dockerfile)
    return root


def _terminal_bench(root: Path, task_yaml: str) -> Path:
    root.mkdir(parents=True)
    (root / "task.yaml").write_text(task_yaml)
    (root / "run-tests.sh").write_text("test -f /app/done.txt\n")
    return root


def _looping(tmp: Path) -> Path:
    root = _hand_written(tmp / "t")
    os.symlink("b", root / "a")
    os.symlink("a", root / "b")
    return root


TASK_FOLDERS = [
    (lambda tmp: _hand_written(tmp / "t", description=b"\xff\xfe caf\xe9"), r"description.md: not UTF-8 text"),
    (lambda tmp: _hand_written(tmp / "t", test=b"\xfftest -f x"), r"test.sh: not UTF-8 text"),
    (_looping, r"/(a|b): a symlink that cannot be followed"),
    (lambda tmp: _harbor(tmp / "h", 'metadata = "hard"\n'), r"task.toml: metadata must be a table"),
    (lambda tmp: _harbor(tmp / "h", dockerfile='FROM x\nCOPY "a b /app/\n'), r"Dockerfile: COPY .*No closing quotation"),
    (lambda tmp: _terminal_bench(tmp / "tb", "- a\n- b\n"), r"task.yaml: must be a mapping .* got list"),
    (lambda tmp: _terminal_bench(tmp / "tb", "just words\n"), r"task.yaml: must be a mapping .* got str"),
]  # fmt: skip


@pytest.mark.parametrize(("make_folder", "message"), TASK_FOLDERS)
def test_a_broken_task_folder_is_a_value_error_naming_the_file(make_folder: Any, message: str, tmp_path: Path) -> None:
    folder = make_folder(tmp_path)
    with pytest.raises(ValueError, match=message):
        load_task_dir(folder)
    with pytest.raises(ValueError, match=message):  # as the env's option too, before any sandbox starts
        TerminalEnv(tasks=[generate_task(0)]).reset(seed=0, options={"task": str(folder)})


# -- QA and corpus files: a bad line names its file and line -------------------------------------------------
QA_LINES = [
    ('{"question": "q", "answers": ["a"], "x": ' + "9" * 5000 + "}", r"qa.jsonl:2: not valid JSON \(Exceeds the limit"),
    ('{"question": "q", "answers": ["a"], "x": ' + "[" * 100_000 + "]" * 100_000 + "}", r"qa.jsonl:2: not valid JSON"),
    (b'{"question": "caf\xe9", "answers": ["a"]}', r"qa.jsonl:2: not UTF-8 text"),
    ('{"question": "q", "answers": ["a"], "oracle_queries": 5}', r"qa.jsonl:2: 'oracle_queries' must be a list"),
    ('{"question": "q", "answers": ["a"], "optimal_tool_calls": true}', r"qa.jsonl:2: 'optimal_tool_calls' must be"),
]  # fmt: skip


@pytest.mark.parametrize(("line", "message"), QA_LINES)
def test_a_bad_qa_line_names_the_file_and_line(line: str | bytes, message: str, tmp_path: Path) -> None:
    good = json.dumps({"question": "q", "answers": ["a"], "oracle_queries": ["q"]}).encode()
    path = tmp_path / "qa.jsonl"
    path.write_bytes(good + b"\n" + (line if isinstance(line, bytes) else line.encode()) + b"\n")
    with pytest.raises(DataFormatError, match=message):
        load_qa(path)
    (tmp_path / "corpus.jsonl").write_bytes(b'{"text": "x"}\n' + (line if isinstance(line, bytes) else line.encode()))
    if "oracle" not in message and "optimal" not in message:  # the same lines in a corpus file
        with pytest.raises(DataFormatError, match=message.replace("qa.jsonl", "corpus.jsonl")):
            load_corpus(tmp_path / "corpus.jsonl")


# -- reset options ----------------------------------------------------------------------------------------------
def test_a_reset_option_of_the_wrong_type_is_a_value_error() -> None:
    ttt = gym.make("rl-llm/TicTacToe-v0")
    with pytest.raises(ValueError, match="agent_mark"):  # passed `in ("X", "O")`, then "unhashable type"
        ttt.reset(seed=0, options={"agent_mark": np.array(["X"])})
    assert ttt.reset(seed=0, options={"agent_mark": "O"})[1]["task_id"]  # the env still plays
    pytest.importorskip("reasoning_gym")
    math_env = gym.make("rl-llm/Math-v0")
    with pytest.raises(ValueError, match=r"options\['family'\] must be one of"):  # was "unhashable type"
        math_env.reset(seed=0, options={"family": ["gcd"]})
    for bad in ({"difficulty": 2.0}, {"difficulty": True}, {"families": None}, {"families": "gcd"}):
        with pytest.raises(ValueError, match=r"difficulty must be one of|families must be a non-empty"):
            gym.make("rl-llm/Math-v0", **bad)


# -- the social games and the attempt wrappers --------------------------------------------------------------
SOCIAL = [
    (lambda: prisoners_dilemma_v0.parallel_env(num_rounds=2.5), r"^num_rounds must be an integer, got 2.5"),
    (lambda: prisoners_dilemma_v0.parallel_env(max_retries=NAN), r"^max_retries must be an integer, got nan"),
    (lambda: prisoners_dilemma_v0.parallel_env(payoffs=[3, 0, 5, NAN]), r"^payoffs\[3\] must be a finite number"),
    (lambda: prisoners_dilemma_v0.parallel_env(payoffs=5), r"^payoffs must be a Payoffs or four numbers"),
    (lambda: split_v0.parallel_env(value_choices=[1, INF]), r"^value_choices\[1\] must be a finite number"),
    (lambda: split_v0.parallel_env(quantity=0), r"^quantity must be an integer >= 1"),
    (lambda: split_v0.parallel_env(items="abc"), r"^items must be a list of distinct"),
    (lambda: trust_and_split_v0.parallel_env(value_range=(1, 2.5)), r"^value_range\[1\] must be an integer"),
    (lambda: trust_and_split_v0.parallel_env(value_range=5), r"^value_range must be \(low, high\)"),
    (lambda: trust_and_split_v0.parallel_env(high_value=NAN), r"^high_value must be a finite number"),
    (lambda: tictactoe_v0.parallel_env(illegal_move_penalty=NAN), r"^illegal_move_penalty must be a finite"),
    (lambda: tictactoe_v0.parallel_env(show_legal_moves="no"), r"^show_legal_moves must be true or false"),
]  # fmt: skip


@pytest.mark.parametrize(("make", "message"), SOCIAL)
def test_a_social_game_refuses_a_bad_setting_in_the_checks_words(make: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


WRAPPERS = [
    (lambda env: TryAgain(env, max_attempts=2.5), r"^max_attempts must be an integer, got 2.5"),
    (lambda env: TryAgain(env, format_penalty=NAN), r"^format_penalty must be a finite number"),
    (lambda env: TryAgain(env, repetition_lambda=INF), r"^repetition_lambda must be a finite number"),
    (lambda env: TryAgain(env, gamma=NAN), r"^gamma must be a finite number"),
    (lambda env: TryAgain(env, restate_task="no"), r"^restate_task must be true or false"),
    (lambda env: MultiAttempt(env, attempts=0), r"^attempts must be an integer >= 1, got 0"),
    (lambda env: MultiAttempt(env, discount=NAN), r"^discount must be a finite number"),
    (lambda env: MultiAttempt(env, wrong_answer_reward=-INF), r"^wrong_answer_reward must be a finite"),
]  # fmt: skip


@pytest.mark.parametrize(("wrap", "message"), WRAPPERS)
def test_an_attempt_wrapper_refuses_a_bad_setting_when_made(wrap: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        wrap(gym.make("rl-llm/ToolCalls-v0"))
