"""The rl-llm command line, run as a user would (a subprocess per command)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rl_llm.envs.registration import env_ids
from tests.cli_env import cli_env

# Long enough that an 80-column hard wrap would split any message that holds it.
LONG = "a-directory-name-long-enough-that-any-80-column-wrap-would-split-the-path-in-two"


def rl_llm(*args: str, stdin: str | None = None, columns: int | None = 250) -> subprocess.CompletedProcess[str]:
    """The CLI through a pipe. Tables size to COLUMNS; `columns=None` leaves rich's 80-column default."""
    env = cli_env(**({"COLUMNS": str(columns)} if columns else {}))
    return subprocess.run([sys.executable, "-m", "rl_llm.cli", *args], input=stdin, capture_output=True, text=True,
                          timeout=300, env=env)  # fmt: skip


def test_list_shows_every_registered_environment() -> None:
    result = rl_llm("list")
    assert result.returncode == 0, result.stderr
    for env_id in env_ids():
        assert env_id in result.stdout


def test_eval_prints_a_table_and_writes_one_jsonl_line_per_episode(tmp_path: Path) -> None:
    out = tmp_path / "ucb.jsonl"
    result = rl_llm("eval", "MultiArmedBandit", "--agent", "ucb", "--episodes", "7", "--seed", "3",
                    "--out", str(out), "-k", "horizon=20")
    assert result.returncode == 0, result.stderr
    assert "regret" in result.stdout and "±" in result.stdout
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["seed"] for r in records] == list(range(3, 10))
    assert all(r["turns"] == 20 and r["agent"] == "ucb" for r in records)


@pytest.mark.parametrize(("args", "message"), [
    (("eval", "NoSuchEnv", "--agent", "ucb"), "unknown environment"),
    (("eval", "TicTacToe", "--agent", "ucb"), "unknown baseline 'ucb'"),
    (("eval", "TicTacToe", "--agent", "minimax", "-k", "novalue"), "KEY=VALUE"),
    (("eval", "TicTacToe", "--agent", "[/x]"), "unknown baseline '[/x]'"),  # not read as rich markup
    # an option the env does not take: its options named, not a TypeError from inside the rollout
    (("eval", "TicTacToe", "--agent", "minimax", "-k", "cells=numbers"), "takes no option 'cells'; its options are"),
    (("eval", "prisoners_dilemma", "-k", "rounds=3"), "takes no option 'rounds'; its options are payoffs, num_rounds"),
    (("play", "MultiArmedBandit", "-k", "arms=3"), "takes no option 'arms'"),
    # an option of the wrong type: a TypeError traceback from inside the env's constructor before (now one
    # line naming the env and the option, whether the env checks the type itself or not)
    (("eval", "MultiArmedBandit", "--agent", "ucb", "-k", "num_arms=abc"), "num_arms"),
    (("eval", "prisoners_dilemma", "--agents", "tit_for_tat", "-k", "num_rounds=abc"), "num_rounds"),
    # no episodes: a table of NaN and exit status 0 before
    (("eval", "MultiArmedBandit", "--agent", "ucb", "--episodes", "0"), "--episodes: must be an integer >= 1, got 0"),
    (("view", ".", "--episodes", "-1"), "--episodes: must be an integer >= 1, got -1"),  # a page of no episodes before
    # numpy's "expected non-negative integer" before, naming no option
    (("eval", "MultiArmedBandit", "--agent", "ucb", "--seed", "-1"), "--seed: must be an integer >= 0, got -1"),
    (("bench", "MultiArmedBandit", "--seed", "-1"), "--seed: must be an integer >= 0, got -1"),
    (("eval", "MultiArmedBandit", "--agent", "ucb", "-k", "num_arms=["), "'[' is no YAML value"),  # a traceback before
    # a key given twice: the last won silently before (as `rl-llm train`'s overrides, below)
    (("eval", "MultiArmedBandit", "--agent", "ucb", "-k", "num_arms=3", "-k", "num_arms=5"),
     "error: -k num_arms is given twice; give each key once"),
    (("play", "MultiArmedBandit", "-k", "means={a: 1, a: 2}"), "line 1, column 8: duplicate key 'a' (first on line 1)"),
    (("train", "optim.lr=1", "optim.lr=2"),
     "error: multiple values for 'optim.lr' ('optim.lr=1' and 'optim.lr=2'); give each key once"),
    (("eval", "MultiArmedBandit", "--agent", "ucb", "-k", "horizon=.nan"), "horizon must be an integer, got nan"),  # hung
    # a model path that is not there: transformers' "Repo id must use alphanumeric chars" traceback before
    (("eval", "MultiArmedBandit", "--agent", "hf:/no/such/model"), "no model directory /no/such/model"),
    # each ignored without a word before
    (("eval", "MultiArmedBandit", "--agent", "ucb", "--agents", "ucb,random"), "--agents is for two-player games"),
    (("eval", "prisoners_dilemma", "--agent", "tit_for_tat", "--agents", "random,tit_for_tat"),
     "give a game's agents once"),
    # NaN or 0 reached the sampler or an export filter that kept nothing
    (("eval", "MultiArmedBandit", "--agent", "ucb", "--temperature", "nan"), "--temperature: must be a finite number"),
    (("eval", "MultiArmedBandit", "--agent", "ucb", "--max-new-tokens", "0"), "--max-new-tokens: must be an integer >= 1"),
    (("export", ".", "--format", "sft-jsonl", "--min-return", "nan"), "--min-return: must be a finite number, got nan"),
])
def test_bad_command_lines_fail_with_a_specific_message(args: tuple[str, ...], message: str) -> None:
    result = rl_llm(*args)
    assert result.returncode == 2, result.stdout + result.stderr  # as argparse's own usage errors (was 1 for some)
    assert message in result.stderr + result.stdout
    assert "Traceback" not in result.stderr


def test_eval_on_a_game_runs_a_round_robin_with_exploitability(tmp_path: Path) -> None:
    out = tmp_path / "ipd.jsonl"
    result = rl_llm("eval", "prisoners_dilemma", "--agents", "tit_for_tat,always_defect", "--episodes", "2",
                    "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "exploit" in result.stdout and "tit_for_tat" in result.stdout
    matches = [json.loads(line) for line in out.read_text().splitlines()]
    assert {m["game"] for m in matches} == {"prisoners_dilemma_v0"}
    head_to_head = [m for m in matches if m["kind"] == "match" and m["agents"] == ["always_defect", "tit_for_tat"]]
    assert head_to_head and all(m["returns"][0] > m["returns"][1] for m in head_to_head)


def test_list_shows_the_two_player_games() -> None:
    result = rl_llm("list")
    assert "prisoners_dilemma_v0" in result.stdout and "tit_for_tat" in result.stdout


def test_play_lets_a_person_finish_a_game_typing_bare_cells() -> None:
    # As X against a perfect opponent the game ends within 5 moves whatever we type; bare cells get wrapped.
    moves = "\n".join(["A1", "A2", "A3", "B1", "B2", "B3", "C1", "C2", "C3"] * 2)
    result = rl_llm("play", "TicTacToe", "--seed", "0", "-k", "agent_mark=X", "-k", "opponent=minimax", stdin=moves)
    assert result.returncode == 0, result.stderr
    assert "Episode over (terminated)" in result.stdout
    assert "You won!" not in result.stdout  # minimax cannot be beaten
    # The header names the env in bold (in a terminal), never as literal markup.
    assert result.stdout.startswith("rl-llm/TicTacToe-v0  task ") and "[bold]" not in result.stdout


def test_play_stops_cleanly_at_the_end_of_input() -> None:
    result = rl_llm("play", "TicTacToe", "--seed", "0", "-k", "opponent=minimax", stdin="B2\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout.rstrip().endswith("bye") and "Episode over" not in result.stdout
    assert "Traceback" not in result.stderr


def test_messages_with_long_paths_are_never_wrapped_in_a_pipe(tmp_path: Path) -> None:
    out = tmp_path / LONG / "ucb.jsonl"
    result = rl_llm("eval", "MultiArmedBandit", "--agent", "ucb", "--episodes", "2", "--out", str(out),
                    "-k", "horizon=5", columns=None)
    assert result.returncode == 0, result.stderr
    assert any(line.startswith(f"episodes written to {out}") for line in result.stdout.splitlines()), result.stdout
    missing = tmp_path / LONG / "no-such-config.yaml"
    result = rl_llm("train", str(missing), columns=None)
    assert result.returncode != 0
    assert any(str(missing) in line for line in result.stdout.splitlines()), result.stdout
    assert "Traceback" not in result.stderr


def test_help_is_never_wrapped_in_a_pipe() -> None:
    """argparse broke every help line at 80 columns in a pipe (``--help | grep`` then missed half a sentence);
    the commands' help, the subcommands' and the servers' keep each line whole there."""
    agent_help = ("baseline name (see `rl-llm list`), hf:tiny, hf:PATH, vllm:MODEL, vllm:http://HOST:PORT#MODEL, "
                  "vllm-serve:MODEL or openai:URL#MODEL")  # fmt: skip
    result = rl_llm("eval", "--help", columns=None)
    assert result.returncode == 0 and agent_help in result.stdout, result.stdout
    result = rl_llm("--help", columns=None)
    assert "an agent over a versioned suite (--agent), or every baseline on every env" in result.stdout
    server = subprocess.run([sys.executable, "-m", "rl_llm.integrations.http_server", "--help"], capture_output=True,
                            text=True, timeout=120, env=cli_env())  # fmt: skip
    assert server.returncode == 0, server.stderr
    assert "log every request and WebSocket connection (off: it costs ~20% of a call)" in server.stdout, server.stdout


@pytest.mark.parametrize("module", ["rl_llm.integrations.http_server", "rl_llm.integrations.openenv",
                                    "rl_llm.integrations.verifiers_hub", "rl_llm.envs.retrieval.server",
                                    "rl_llm.sandboxes.rootfs", "rl_llm.envs.sql.chinook"])  # fmt: skip
def test_documented_module_commands_start_without_warnings(module: str) -> None:
    """The ``python -m`` commands the docs give: ``rl_llm.envs.retrieval.server`` warned that runpy found it
    already imported (its package loaded it) before running it."""
    if module.endswith("openenv"):
        pytest.importorskip("openenv.core", reason="openenv-core: pip install 'rl-llm[openenv]'")
    result = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=120,
                            env=cli_env())  # fmt: skip
    assert result.returncode == 0 and result.stdout.startswith("usage:"), result.stderr
    assert "Warning" not in result.stderr, result.stderr


def test_people_console_keeps_messages_whole_and_tables_uncut_outside_a_terminal(monkeypatch) -> None:
    import io

    from rich.table import Table

    from rl_llm.console import make_console

    monkeypatch.delenv("COLUMNS", raising=False)
    out = io.StringIO()
    console = make_console(file=out)
    message = "error: " + " ".join(f"/some/long/path/part{i}" for i in range(20))
    console.print(f"[red]{message}[/red]")
    table = Table(title="results")
    table.add_column("agent")
    table.add_column("return")
    table.add_row("vllm:http://127.0.0.1:8000#Qwen/Qwen2.5-0.5B-Instruct", "1.000 ± 0.000")
    console.print(table)
    lines = out.getvalue().splitlines()
    assert lines[0] == message  # one line, no markup left
    assert any("vllm:http://127.0.0.1:8000#Qwen/Qwen2.5-0.5B-Instruct" in line for line in lines)
    assert "…" not in out.getvalue()


def test_sigusr1_prints_every_threads_stack_and_the_command_goes_on() -> None:
    # `kill -USR1 PID` on a run that seems stuck: where it is, without a debugger (benchmarks/gpu_check.py sends
    # it to a phase past its limit). Without the handler SIGUSR1 would end the process.
    process = subprocess.Popen([sys.executable, "-m", "rl_llm.cli", "play", "MultiArmedBandit"], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env())  # fmt: skip
    try:
        assert "MultiArmedBandit" in process.stdout.readline()  # the handler is set before the command starts
        os.kill(process.pid, signal.SIGUSR1)
        out, err = process.communicate(input="", timeout=120)  # then end of input: the game says bye
    finally:
        process.kill()
    assert process.returncode == 0, err
    assert "(most recent call first):" in err and 'File "' in err
    assert out.rstrip().endswith("bye")


def test_an_out_that_is_a_directory_is_one_line_and_left_alone(tmp_path: Path) -> None:
    # The atomic write's final rename failed with IsADirectoryError, a traceback naming a temporary file.
    records = tmp_path / "ucb.jsonl"
    assert rl_llm("eval", "MultiArmedBandit", "--agent", "ucb", "--episodes", "2", "--out", str(records)).returncode == 0
    target = tmp_path / "a-directory"
    (target / "inside").mkdir(parents=True)
    for args in (("view", str(records.with_suffix(".trajectories.jsonl"))), ("export", str(records), "--format", "sft-jsonl")):
        result = rl_llm(*args, "--out", str(target))
        assert result.returncode == 2, result.stdout + result.stderr
        assert f"error: {target} is a directory; name a file to write instead" in result.stdout
        assert "Traceback" not in result.stderr
    assert [p.name for p in target.iterdir()] == ["inside"]


def test_eval_out_that_is_a_directory_fails_before_any_episode(tmp_path: Path) -> None:
    """The directory made the last write fail, after every episode had been played (hours, for an LLM)."""
    for args in (("MultiArmedBandit", "--agent", "ucb"), ("prisoners_dilemma", "--agents", "tit_for_tat")):
        result = rl_llm("eval", *args, "--episodes", "2", "--out", str(tmp_path))
        assert result.returncode == 2, result.stdout + result.stderr
        assert result.stdout.splitlines() == [f"error: --out {tmp_path} is a directory; name a .jsonl file to write "
                                              "instead"]  # fmt: skip
    assert not list(tmp_path.parent.glob(f"{tmp_path.name}.*"))  # no trajectories or plot beside it
