"""``rl-llm train`` given inputs that cannot run as asked, through the real command line: one ``error:`` line
(or, for Ctrl-C, one line saying how to resume), never a traceback, and a previous run's directory never mixed
with or overwritten by another run."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rl_llm.trainers.logging import read_metrics
from tests.cli_env import cli_env

# A run of a few seconds: no warm start, 2x2 episodes per step, two held-out seeds, no plots or trackers.
FAST = ["sft.episodes=0", "eval.episodes=2", "eval.baselines=[]", "rollout.prompts_per_step=2",
        "rollout.group_size=2", "optim.micro_batch_size=4", "optim.minibatches=1", "log.report_to=[]",
        "log.plot=false", "log.progress=false"]  # fmt: skip


def train(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rl_llm.cli", "train", *args], capture_output=True, text=True,
                          timeout=300, env=cli_env())  # fmt: skip


def assert_one_error_line(result: subprocess.CompletedProcess[str], message: str) -> None:
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert "Traceback" not in output, output
    assert any(line.startswith("error: ") and message in line for line in output.splitlines()), output


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-step run with its checkpoint; tests copy it before changing anything."""
    run_dir = tmp_path_factory.mktemp("runs") / "done"
    result = train("steps=1", *FAST, "--out", str(run_dir))
    assert result.returncode == 0, result.stdout + result.stderr
    return run_dir


@pytest.mark.parametrize(("override", "message"), [
    ("env.kwargs.horizon=5", "holds a run with env.kwargs.horizon=4, not 5"),
    ("model.lora.enabled=true", "holds a run with model.lora.enabled=False, not True"),  # was a traceback
    ("algorithm=ppo", "holds a run with algorithm='grpo', not 'ppo'"),  # was a KeyError on 'critic'
])
def test_another_config_is_not_resumed_into_a_finished_run(finished_run: Path, tmp_path: Path, override: str,
                                                           message: str) -> None:  # fmt: skip
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    summary = (run_dir / "summary.json").read_text()
    result = train("steps=2", *FAST, override, "--out", str(run_dir))
    assert_one_error_line(result, message)
    assert f"rl-llm train {run_dir / 'config.yaml'} --out {run_dir}" in result.stdout  # the command that resumes it
    assert (run_dir / "summary.json").read_text() == summary  # untouched


def test_a_corrupt_checkpoint_is_named_and_a_lost_latest_file_does_not_restart_the_run(finished_run: Path,
                                                                                      tmp_path: Path) -> None:  # fmt: skip
    corrupt = tmp_path / "corrupt"
    shutil.copytree(finished_run, corrupt)
    policy = corrupt / "checkpoints" / "step_000001" / "policy.pt"
    policy.write_bytes(policy.read_bytes()[:100])  # truncated after saving
    assert_one_error_line(train("steps=2", *FAST, "--out", str(corrupt)),
                          f"checkpoint {policy.parent} cannot be read")  # fmt: skip

    # Without `latest` the run used to start over from step 0, cutting metrics.jsonl back and overwriting it.
    lost = tmp_path / "lost"
    shutil.copytree(finished_run, lost)
    (lost / "checkpoints" / "latest").unlink()
    result = train("steps=2", *FAST, "--out", str(lost))
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads((lost / "summary.json").read_text())["resumed_from_step"] == 1
    assert [record["step"] for record in read_metrics(lost / "metrics.jsonl")] == [1, 2]


def test_an_out_that_is_a_file_or_env_kwargs_of_the_wrong_type_are_one_line(tmp_path: Path) -> None:
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine\n")
    assert_one_error_line(train("steps=1", *FAST, "--out", str(a_file)), "is a file, not a directory")
    assert a_file.read_text() == "mine\n"
    # The env's constructor compared num_arms with a number: a TypeError from inside Gymnasium before; now the
    # env checks its arguments (rl_llm/checks.py).
    result = train("steps=1", *FAST, "env.kwargs.num_arms=abc", "--out", str(tmp_path / "run"))
    assert_one_error_line(result, "num_arms must be an integer, got 'abc'")


def test_ctrl_c_stops_the_run_with_its_checkpoint_and_the_resume_command(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "rl_llm.cli", "train", "steps=200", "log.checkpoint_every=2", *FAST,
               "--out", str(run_dir)]  # fmt: skip
    # SIGINT at its default in the child (a test run started in the background may ignore it, and so would the child)
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=cli_env(),
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    deadline = time.monotonic() + 240
    while len(read_metrics(run_dir / "metrics.jsonl")) < 3 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)  # mid-run: most of a step is its rollout
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 130, output
    assert "Traceback" not in output and "UnboundLocalError" not in output, output
    resume = f"Resume with: rl-llm train {run_dir / 'config.yaml'} --out {run_dir}"
    assert f"interrupted; {run_dir} keeps the checkpoint of step" in output and resume in output, output
    resumed = train(str(run_dir / "config.yaml"), "steps=5", "--out", str(run_dir))
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert [record["step"] for record in read_metrics(run_dir / "metrics.jsonl")] == [1, 2, 3, 4, 5]


def test_a_run_started_over_measures_its_own_policy_before_training(finished_run: Path, tmp_path: Path) -> None:
    """A run stopped before its first checkpoint starts over when run again, with any config; its held-out
    figures before training (eval_before.json, kept for resumes) were reused from the earlier attempt."""
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    shutil.rmtree(run_dir / "checkpoints")  # stopped before its first checkpoint
    stale = {"seeds": [0, 1], "values": {"return": [123.0, 123.0]}}  # another config's measure
    (run_dir / "eval_before.json").write_text(json.dumps(stale))
    result = train("steps=1", *FAST, "env.kwargs.horizon=5", "--out", str(run_dir))
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads((run_dir / "eval_before.json").read_text()) != stale
    assert json.loads((run_dir / "summary.json").read_text())["return_before"] != 123.0


def test_each_phase_outside_the_steps_is_announced_in_order(tmp_path: Path) -> None:
    """With a real model, loading it, the warm start, starting a vLLM engine and each evaluation take minutes,
    and the run printed nothing from its directory line to its first step."""
    fast = [pair for pair in FAST if not pair.startswith(("log.progress=", "sft.episodes="))]  # a key once
    result = train("steps=1", *fast, "log.progress=true", "sft.episodes=4", "sft.held_out_episodes=2",
                   "--out", str(tmp_path / "run"))  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    expected = ["loading ", "warm start: SFT on 4 episodes of the ", "starting the generator: hf",
                "evaluating the starting policy on 2 held-out seeds", "step 1/1 ",
                "evaluating the trained policy on 2 held-out seeds"]  # fmt: skip
    found = [next(i for i, line in enumerate(lines) if text in line) for text in expected]
    assert found == sorted(found), result.stdout
    assert all(lines[i].startswith("[") and "s] " in lines[i] for i in found if "step 1/1" not in lines[i])
