"""``rl-llm bench --agent``: suites, normalized scores, resuming, retries against a real HTTP server, and
smoke-v1 against a real vLLM server of the tiny model."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

from rl_llm.agents.baselines import baselines_for
from rl_llm.agents.bench import available_suites, load_suite, run_bench
from rl_llm.agents.bench.episodes import jobs_for
from rl_llm.agents.bench.runner import opponents_of
from rl_llm.agents.bench.suite import parse_suite
from rl_llm.agents.policy import TextPolicy
from rl_llm.envs.base import Outcome, Task, TextEnv
from rl_llm.envs.registration import env_ids
from rl_llm.envs.social import GAMES
from tests.cli_env import cli_env

TINY_SUITE = {  # two short bandit episodes: what the HTTP tests play
    "name": "tiny",
    "version": 1,
    "envs": [{"key": "bandit", "env": "rl-llm/MultiArmedBandit-v0", "episodes": 2,
              "kwargs": {"num_arms": 3, "horizon": 3, "reward_mode": "strategic"}}],
}  # fmt: skip


def quiet(line: str) -> None:
    pass


def episodes(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def reference_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bench-references")


def test_every_environment_has_a_random_baseline() -> None:
    for env in [*env_ids(), *GAMES]:
        assert "random" in baselines_for(env), env


def test_shipped_suites_load_and_name_real_baselines() -> None:
    assert {"smoke-v1", "core-v1"} <= set(available_suites())
    for name in ("smoke-v1", "core-v1"):
        suite = load_suite(name)
        assert suite.id == name and suite.envs
        assert {entry.env for entry in suite.envs} >= {"rl-llm/TextToSQL-v0", "prisoners_dilemma_v0"}
    with pytest.raises(ValueError, match="no baseline"):
        parse_suite({**TINY_SUITE, "envs": [{**TINY_SUITE["envs"][0], "reference": "nope"}]})
    with pytest.raises(ValueError, match="unknown environment"):
        parse_suite({**TINY_SUITE, "envs": [{"key": "x", "env": "rl-llm/Nope-v0"}]})
    with pytest.raises(ValueError, match="unknown suite"):
        load_suite("nope-v9")


@pytest.mark.usefixtures("math_extra")  # smoke-v1 holds rl-llm/Math-v0
@pytest.mark.parametrize("agent, expected", [("oracle", 1.0), ("random", 0.0)])
def test_smoke_baselines_score_their_anchors(
    agent: str, expected: float, tmp_path: Path, reference_cache: Path
) -> None:
    suite = load_suite("smoke-v1")
    results = run_bench(suite, agent, tmp_path, reference_cache=reference_cache, log=quiet)
    assert results["complete"] and results["suite"] == "smoke" and results["suite_version"] == 1
    assert results["agent"] == agent and results["rl_llm_version"]
    for entry in suite.envs:
        row = results["envs"][entry.key]
        assert row["episodes"] == row["planned"] == len(jobs_for(entry, opponents_of(entry)))
        assert row["reference"] > row["random"], entry.key  # the suite must separate its anchors
        assert row["normalized"] == pytest.approx(expected, abs=1e-9), entry.key
        assert row["tokens"] == 0
        assert (row["success_rate"] is None) == (entry.success is None)
    assert results["aggregate"] == {"normalized": pytest.approx(expected), "envs": len(suite.envs)}
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk["envs"].keys() == results["envs"].keys()
    table = (tmp_path / "results.md").read_text()
    assert all(f"| {entry.key} |" in table for entry in suite.envs) and "aggregate" in table
    assert (tmp_path / "normalized.png").stat().st_size > 0
    ids = [record["id"] for record in episodes(tmp_path)]
    assert len(ids) == len(set(ids)) == sum(row["planned"] for row in results["envs"].values())


@pytest.mark.usefixtures("math_extra")
def test_resumed_run_equals_uninterrupted_one(tmp_path: Path, reference_cache: Path) -> None:
    suite = load_suite("smoke-v1")
    whole = run_bench(suite, "random", tmp_path / "whole", reference_cache=reference_cache, log=quiet)
    parts = tmp_path / "parts"
    first = run_bench(suite, "random", parts, max_episodes=7, reference_cache=reference_cache, log=quiet)
    assert not first["complete"] and "episode limit" in first["stopped"] and len(episodes(parts)) == 7
    with (parts / "episodes.jsonl").open("a") as handle:
        handle.write('{"id": "sql-single/0", "episode_ret')  # a line cut short by a kill: dropped, replayed
    resumed = run_bench(suite, "random", parts, reference_cache=reference_cache, log=quiet)
    assert resumed["complete"]
    key = lambda record: record["id"]  # noqa: E731
    assert sorted(episodes(parts), key=key) == sorted(episodes(tmp_path / "whole"), key=key)
    assert resumed["envs"] == whole["envs"] and resumed["aggregate"] == whole["aggregate"]
    with pytest.raises(ValueError, match="holds a run of random"):
        run_bench(suite, "oracle", parts, reference_cache=reference_cache, log=quiet)


KILL_DRIVER = """
import os, signal, sys
from pathlib import Path
from rl_llm.agents.bench import episodes, load_suite, run_bench

appended, kill_after = [0], int(sys.argv[3])
original = episodes.EpisodeLog.append

def append(self, entry):
    appended[0] += 1
    if appended[0] > kill_after:  # die half way through writing this episode's line
        with self.path.open("a") as handle:
            handle.write('{"id": "' + entry["id"] + '", "epis')
        os.kill(os.getpid(), signal.SIGKILL)
    original(self, entry)

episodes.EpisodeLog.append = append
run_bench(load_suite("smoke-v1"), "random", Path(sys.argv[1]), reference_cache=Path(sys.argv[2]), log=print)
"""


@pytest.mark.usefixtures("math_extra")
def test_killed_process_resumes_without_duplicates_or_losses(tmp_path: Path, reference_cache: Path) -> None:
    out = tmp_path / "run"
    driver = tmp_path / "driver.py"
    driver.write_text(KILL_DRIVER)
    killed = subprocess.run(
        [sys.executable, str(driver), str(out), str(reference_cache), "9"], capture_output=True
    )
    assert killed.returncode == -9, killed.stderr.decode()[-2000:]
    assert len(episodes_text := (out / "episodes.jsonl").read_text().splitlines()) == 10
    assert not episodes_text[-1].endswith("}")  # the torn line
    suite = load_suite("smoke-v1")
    resumed = run_bench(suite, "random", out, reference_cache=reference_cache, log=quiet)
    whole = run_bench(suite, "random", tmp_path / "whole", reference_cache=reference_cache, log=quiet)
    assert resumed["complete"]
    assert sorted(map(json.dumps, episodes(out))) == sorted(map(json.dumps, episodes(tmp_path / "whole")))
    assert resumed["envs"] == whole["envs"]


class SayEnv(TextEnv):
    """Two turns an episode, reward 1 for saying "good"; seed 1's second step raises (a crashed tool)."""

    def __init__(self) -> None:
        super().__init__(max_turns=2)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        self.episode_seed = seed
        return super().reset(seed=seed, options=options)

    def _reset(self, options: dict[str, Any]) -> Task:
        return Task(observation="Say something.", task_id=f"say-{self.episode_seed}", system_prompt="Talk.")

    def _step(self, action: str) -> Outcome:
        if self.episode_seed == 1 and self.turn == 2:
            raise RuntimeError("tool crashed")
        return Outcome("Again.", {"said": float(action == "good")}, terminated=self.turn >= 2)


class Say(TextPolicy):
    def __init__(self, word: str) -> None:
        self.word = word

    def respond(self, conversation: list) -> str:
        return self.word


@pytest.fixture
def say_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    from rl_llm.agents.baselines import BASELINES

    env_id = "tests/Say-v0"
    gym.register(env_id, entry_point=SayEnv)
    monkeypatch.setitem(BASELINES, env_id, {"random": lambda seed=None: Say("bad"),
                                            "oracle": lambda seed=None: Say("good")})  # fmt: skip
    yield env_id
    gym.registry.pop(env_id, None)


def test_an_env_error_fails_its_episode_only_and_baseline_runs_keep_trajectories(say_env: str, tmp_path: Path,
                                                                                 reference_cache: Path) -> None:  # fmt: skip
    from rl_llm.agents.bench.suite import Suite, SuiteEnv
    from rl_llm.agents.rollout import read_trajectories
    from rl_llm.view import load

    suite = Suite("say", 1, (SuiteEnv("say", say_env, episodes=4),))
    results = run_bench(suite, "oracle", tmp_path, reference_cache=reference_cache, log=quiet)
    row = results["envs"]["say"]
    assert not results["complete"] and row["episodes"] == 3 and row["errors"] == 1
    assert "env.step failed: RuntimeError: tool crashed" in row["first_error"]
    assert row["random"] == 0.0 and row["reference"] == 2.0 and row["normalized"] == 1.0  # failed one left out
    assert sorted(record["id"] for record in episodes(tmp_path)) == ["say/0", "say/2", "say/3"]
    # The baseline's episodes are kept whole, as an LLM's are, and `rl-llm view` shows them.
    trajectories = read_trajectories(tmp_path / "episodes.trajectories.jsonl")
    assert sorted(t.group_id for t in trajectories) == ["say/0", "say/2", "say/3"]
    assert all(t.turns[0].action == "good" and not t.token_ids for t in trajectories)
    page = load(tmp_path)
    assert len(page["episodes"]) == 3 and page["episodes"][0]["turns"][0]["action"] == "good"
    resumed = run_bench(suite, "oracle", tmp_path, reference_cache=reference_cache, log=quiet)
    assert resumed["envs"]["say"]["errors"] == 1 and len(episodes(tmp_path)) == 3  # tried again, failed again


class ChatServer:
    """A real OpenAI-style HTTP server on 127.0.0.1: answers ``<action>A</action>`` to every chat request
    after failing the first ones with the scripted statuses (429 with Retry-After, 5xx)."""

    def __init__(self, failures: list[int]) -> None:
        self.failures = list(failures)
        self.statuses: list[int] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with lock:
                    status = outer.failures.pop(0) if outer.failures else 200
                    outer.statuses.append(status)
                if status != 200:
                    body = b'{"error": {"message": "slow down"}}'
                    self.send_response(status)
                    self.send_header("Retry-After", "0")
                else:
                    message = {"role": "assistant", "content": "<action>A"}  # the API drops the stop string
                    body = json.dumps({"choices": [{"message": message, "finish_reason": "stop"}]}).encode()
                    self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.spec = f"openai:http://127.0.0.1:{self.server.server_address[1]}/v1#stub-model"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def chat_server(request: pytest.FixtureRequest) -> Iterator[ChatServer]:
    server = ChatServer(getattr(request, "param", []))
    yield server
    server.close()


@pytest.mark.parametrize("chat_server", [[429, 429, 503]], indirect=True)
def test_http_agent_retries_429_and_5xx_with_backoff(chat_server: ChatServer, tmp_path: Path,
                                                     reference_cache: Path) -> None:  # fmt: skip
    suite = parse_suite(TINY_SUITE)
    options = {"max_retries": 3, "backoff_s": 0.01}
    results = run_bench(suite, chat_server.spec, tmp_path, concurrency=1, policy_options=options,
                        reference_cache=reference_cache, log=quiet)  # fmt: skip
    row = results["envs"]["bandit"]
    assert results["complete"] and row["episodes"] == 2 and row["errors"] == 0
    assert chat_server.statuses == [429, 429, 503] + [200] * 6  # 2 episodes x 3 pulls, after 3 refusals
    assert row["invalid_action_rate"] == 0.0  # the restored stop string made every answer a valid pull
    # no token ids from a chat API: 4 characters a token, per episode
    assert row["tokens"] == 2 * math.ceil(3 * len("<action>A</action>") / 4) and row["tokens_estimated"]
    assert len((tmp_path / "episodes.trajectories.jsonl").read_text().splitlines()) == 2


@pytest.mark.parametrize("chat_server", [[500] * 4], indirect=True)
def test_failed_episodes_are_not_logged_and_run_again_on_resume(chat_server: ChatServer, tmp_path: Path,
                                                                reference_cache: Path) -> None:  # fmt: skip
    suite = parse_suite(TINY_SUITE)
    options = {"max_retries": 1, "backoff_s": 0.01}
    failed = run_bench(suite, chat_server.spec, tmp_path, concurrency=1, policy_options=options,
                       reference_cache=reference_cache, log=quiet)  # fmt: skip
    row = failed["envs"]["bandit"]
    assert (
        not failed["complete"] and row["errors"] == 2 and row["episodes"] == 0 and "500" in row["first_error"]
    )
    log = tmp_path / "episodes.jsonl"
    assert not log.exists() or not log.read_text()  # nothing recorded as done
    resumed = run_bench(suite, chat_server.spec, tmp_path, concurrency=1, policy_options=options,
                        reference_cache=reference_cache, log=quiet)  # fmt: skip
    assert resumed["complete"] and resumed["envs"]["bandit"]["episodes"] == 2


def test_token_budget_stops_starting_episodes(
    chat_server: ChatServer, tmp_path: Path, reference_cache: Path
) -> None:
    suite = parse_suite(TINY_SUITE)
    results = run_bench(suite, chat_server.spec, tmp_path, concurrency=1, max_tokens_budget=10,
                        reference_cache=reference_cache, log=quiet)  # fmt: skip
    assert not results["complete"] and "token budget" in results["stopped"]
    assert results["envs"]["bandit"]["episodes"] == 1 and results["tokens"] >= 10


def test_cli_bench_agent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    from rl_llm.cli import main

    monkeypatch.setenv("RL_LLM_CACHE", str(tmp_path / "cache"))
    suite = tmp_path / "suite.yaml"
    suite.write_text(json.dumps(TINY_SUITE))  # JSON is YAML
    assert main(["bench", "--agent", "oracle", "--suite", str(suite), "--out", str(tmp_path / "run")]) == 0
    assert "| bandit | 2/2 |" in capsys.readouterr().out
    assert json.loads((tmp_path / "run" / "results.json").read_text())["aggregate"]["normalized"] == 1.0
    assert main(["bench", "--agent", "oracle", "--temperature", "0.5", "--suite", str(suite)]) == 2


@pytest.mark.usefixtures("math_extra")
def test_smoke_suite_against_a_real_vllm_server(
    vllm_server: Any, tmp_path: Path, reference_cache: Path
) -> None:
    from rl_llm.agents.rollout import read_trajectories

    suite = load_suite("smoke-v1")
    agent = f"vllm:{vllm_server.url}#{vllm_server.model}"
    results = run_bench(suite, agent, tmp_path, concurrency=8, reference_cache=reference_cache, log=quiet,
                        policy_options={"max_new_tokens": 24, "temperature": 1.0})  # fmt: skip
    assert results["complete"], {key: row.get("first_error") for key, row in results["envs"].items()}
    for key, row in results["envs"].items():
        assert row["errors"] == 0 and row["episodes"] == row["planned"], key
        assert math.isfinite(row["normalized"]) and row["tokens"] > 0 and not row["tokens_estimated"], key
    single = [entry for entry in suite.envs if not entry.is_game]
    trajectories = read_trajectories(tmp_path / "episodes.trajectories.jsonl")
    assert len(trajectories) == sum(entry.episodes for entry in single)
    assert {t.group_id for t in trajectories} == {f"{e.key}/{seed}" for e in single for seed in e.seeds}
    assert sum(t.num_policy_tokens for t in trajectories) <= results["tokens"]
    view = pytest.importorskip("rl_llm.view", reason="needs rl_llm.view (rl-llm view)")
    assert view.write_view(tmp_path, tmp_path / "view.html", episodes=4, tokenizer=None).stat().st_size > 0


def test_a_second_bench_on_the_same_directory_is_refused(tmp_path: Path) -> None:
    """Two writers on one --out would append the same episodes twice: while one process holds the run
    directory, `rl-llm bench` on it stops at once with one error line (exit 2) and writes nothing."""
    out = tmp_path / "run"
    out.mkdir()
    suite = tmp_path / "suite.yaml"
    suite.write_text(json.dumps(TINY_SUITE))
    env = cli_env(COLUMNS="200", RL_LLM_CACHE=str(tmp_path / "cache"))
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from pathlib import Path; from rl_llm.agents.bench.runner import "
         "run_dir_lock\nwith run_dir_lock(Path(sys.argv[1])):\n    print('held', flush=True); sys.stdin.read()",
         str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        command = [sys.executable, "-m", "rl_llm.cli", "bench", "--agent", "oracle", "--suite", str(suite),
                   "--out", str(out)]  # fmt: skip
        refused = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        errors = [line for line in refused.stdout.splitlines() if line.startswith("error:")]
        assert errors == [f"error: {out} is in use by another rl-llm bench (pid {holder.pid}); wait for it to "
                          "finish or use another --out"], refused.stdout  # fmt: skip
        assert "Traceback" not in refused.stderr and not (out / "episodes.jsonl").exists()
    finally:
        holder.communicate("", timeout=60)  # the holder exits: its lock goes with it
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(record["id"] for record in episodes(out)) == ["bandit/0", "bandit/1"]


@pytest.mark.parametrize(("args", "suite", "message"), [
    # a baseline of no env in the suite: every env skipped, exit status 0 and a run of nothing before
    (("--agent", "nosuch"), TINY_SUITE, "unknown agent 'nosuch': no baseline of tiny-v1"),
    # usage errors, in argparse's words on stderr as for every other flag
    (("--agent", "random", "--max-episodes", "-1"), TINY_SUITE, "argument --max-episodes: must be an integer >= 0, got -1"),
    (("--agent", "random", "--max-tokens-budget", "-5"), TINY_SUITE, "argument --max-tokens-budget: must be an integer >= 0"),
    (("--agent", "random", "--concurrency", "0"), TINY_SUITE, "argument --concurrency: must be an integer >= 1, got 0"),
    (("--agent", "random", "--temperature", "nan"), TINY_SUITE, "argument --temperature: must be a finite number, got nan"),
    # tracebacks before: yaml's ScannerError, TypeError, KeyError
    (("--agent", "random"), "name: [x\n",
     "suite.yaml: not a suite YAML file (line 2, column 1: while parsing a flow sequence: expected ','"),
    # a repeated key: the last value won silently before (here 9 episodes instead of 2)
    (("--agent", "random"), "name: tiny\nversion: 1\nenvs:\n  - key: bandit\n    env: rl-llm/MultiArmedBandit-v0\n"
     "    episodes: 2\n    episodes: 9\n",
     "suite.yaml: not a suite YAML file (line 7, column 5: duplicate key 'envs[0].episodes' (first on line 6))"),
    (("--agent", "random"), {**TINY_SUITE, "envs": [1]}, "envs must be a list of mappings, each with a key and an env"),
    (("--agent", "random"), {**TINY_SUITE, "envs": [{"env": "rl-llm/MultiArmedBandit-v0"}]}, "each with a key"),
    (("--agent", "random"), {**TINY_SUITE, "envs": [{**TINY_SUITE["envs"][0], "kwargs": [1]}]},
     "suite.yaml: cannot convert dictionary update sequence"),
])  # fmt: skip
def test_bad_bench_input_fails_on_one_line_and_writes_nothing(args: tuple[str, ...], suite: object, message: str,
                                                              tmp_path: Path) -> None:  # fmt: skip
    path = tmp_path / "suite.yaml"
    path.write_text(suite if isinstance(suite, str) else json.dumps(suite))
    out = tmp_path / "run"
    result = subprocess.run([sys.executable, "-m", "rl_llm.cli", "bench", *args, "--suite", str(path), "--out",
                             str(out)], capture_output=True, text=True, timeout=300,
                            env=cli_env(COLUMNS="200", RL_LLM_CACHE=str(tmp_path / "cache")))  # fmt: skip
    said = result.stderr if message.startswith("argument --") else result.stdout
    assert result.returncode == 2 and message in said, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and not out.exists()


def test_bench_out_that_holds_files_but_no_bench_run_is_refused(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture) -> None:  # fmt: skip
    """A person's folder as --out: bench wrote results.md, episodes.jsonl... among (or over) their files."""
    from rl_llm.cli import main

    suite, out = tmp_path / "suite.yaml", tmp_path / "project"
    suite.write_text(json.dumps(TINY_SUITE))
    out.mkdir()
    (out / "results.md").write_text("my results")
    assert main(["bench", "--agent", "random", "--suite", str(suite), "--out", str(out)]) == 2
    assert (f"error: --out {out} is a non-empty directory that holds no bench run (no run.json); choose a new or "
            "empty --out") in capsys.readouterr().out  # fmt: skip
    assert [path.name for path in out.iterdir()] == ["results.md"] and (out / "results.md").read_text() == "my results"
    # a bench run directory (its run.json) is resumed as before
    run = tmp_path / "run"
    assert main(["bench", "--agent", "random", "--suite", str(suite), "--out", str(run), "--max-episodes", "1"]) == 0
    assert main(["bench", "--agent", "random", "--suite", str(suite), "--out", str(run)]) == 0
    assert len(episodes(run)) == 2


def test_bench_out_that_is_a_file_is_named(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from rl_llm.cli import main

    suite, out = tmp_path / "suite.yaml", tmp_path / "taken"
    suite.write_text(json.dumps(TINY_SUITE))
    out.write_text("keep")
    assert main(["bench", "--agent", "random", "--suite", str(suite), "--out", str(out)]) == 2
    # "[Errno 17] File exists: ..." before
    assert f"error: --out {out} is a file; bench writes a run directory there" in capsys.readouterr().out
    assert out.read_text() == "keep"
