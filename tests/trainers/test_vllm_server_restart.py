"""A server-mode run whose vLLM server is SIGKILLed mid-run (vLLM's CPU build here; the same code on GPUs).

The run started the server itself (no ``rollout.vllm.server_url``), so it restarts it, pushes the trainer's
current weights and finishes every step with whole batches (a kill during the final evaluation: the evaluation
is played again), and a resume keeps the run's restart count; with ``rollout.vllm.max_restarts=0`` the CLI stops
with one ``error:`` line naming the server's log and the resume command; a server the user runs
(``server_url``) is never restarted: the run stops with one line naming it (docs/vllm.md#when-the-server-dies).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from rl_llm.agents.vllm_backend import vllm_import_error

VLLM_MISSING = vllm_import_error()
pytestmark = pytest.mark.skipif(VLLM_MISSING is not None, reason=f"needs vLLM (CPU or GPU build): {VLLM_MISSING}")

REPO = Path(__file__).resolve().parents[2]
TOLERANCE = 1e-4  # fp32 on both sides
SEQUENCE = [(37 * i + 11) % 1900 + 100 for i in range(40)]  # fixed token ids inside the tiny vocabulary
OVERRIDES = [
    "algorithm=reinforce",  # no group baseline: every update moves the weights
    "rollout.backend=vllm", "rollout.vllm.mode=server", "rollout.vllm.max_model_len=4096",
    "rollout.vllm.server_args=[--kv-cache-memory-bytes, '536870912']",  # 512 MiB, as the session server
    "model.dtype=float32", "steps=3", "eval.episodes=2", "rollout.prompts_per_step=2", "rollout.group_size=2",
    "rollout.max_new_tokens=4", "env.kwargs={num_arms: 3, horizon: 2}", "optim.lr=0.05",
    "log.tensorboard=false", "log.progress=false", "log.plot=false", "eval.baselines=[]",
]  # fmt: skip


def server_logprobs(url: str, model: str) -> torch.Tensor:
    """The server's log-prob of each token of ``SEQUENCE`` after its prefix (prompt log-probs)."""
    import httpx

    body = {"model": model, "prompt": SEQUENCE, "max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 0}
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
    response.raise_for_status()
    entries = response.json()["choices"][0]["prompt_logprobs"]
    return torch.tensor([entry[str(token)]["logprob"] for entry, token in zip(entries[1:], SEQUENCE[1:])])


def trainer_logprobs(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([SEQUENCE])).logits[0, :-1].float()
    return torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(SEQUENCE[1:])[:, None])[:, 0]


def sigkill(process: Any) -> list[int]:
    """SIGKILL the server's process (no clean-up runs in it) and wait until it is gone; the pids of the
    processes it had started (vLLM's engine core and workers), which the kill alone leaves running."""
    children = descendants(process.pid)
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=60)
    return children


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a process, None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[0], int(fields[1])


def descendants(pid: int) -> list[int]:
    parents = {int(p.name): stat[1] for p in Path("/proc").iterdir() if p.name.isdigit() and (stat := _stat(int(p.name)))}
    found, frontier = [], [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def alive(pids: list[int]) -> list[int]:
    return [pid for pid in pids if (stat := _stat(pid)) is not None and stat[0] != "Z"]  # zombies count as gone


def test_a_killed_server_is_restarted_with_the_trainers_weights_and_the_run_finishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import rl_llm.trainers.runner as runner
    from rl_llm.trainers.config import load_config
    from rl_llm.trainers.grpo import train_grpo
    from rl_llm.trainers.runner import TrainingRun

    seen: dict[str, Any] = {"pids": [], "children": []}
    log_step, play, close, evaluate_llm = TrainingRun.log_step, TrainingRun._play, TrainingRun.close, runner.evaluate_llm

    def log_then_kill(run: TrainingRun, step: int, *args: Any, **kwargs: Any) -> None:
        seen["run"] = run
        log_step(run, step, *args, **kwargs)
        if step == 1:  # after step 1's push: the next step's health check finds the server dead
            seen["pids"].append(run.generator.server.process.pid)
            seen["children"] += sigkill(run.generator.server.process)

    def kill_then_play(run: TrainingRun, seeds: list[int]) -> Any:
        if run.step == 2 and not seen.get("killed_in_rollout"):  # step 3's first rollout: its requests fail
            seen["killed_in_rollout"] = True
            seen["pids"].append(run.generator.server.process.pid)
            seen["children"] += sigkill(run.generator.server.process)
        return play(run, seeds)

    def kill_then_evaluate(*args: Any, **kwargs: Any) -> Any:  # the final evaluation: after its health check
        run = seen.get("run")
        if run is not None and run.step == 3 and not seen.get("killed_in_eval"):
            seen["killed_in_eval"] = True
            seen["pids"].append(run.generator.server.process.pid)
            seen["children"] += sigkill(run.generator.server.process)
        return evaluate_llm(*args, **kwargs)

    def compare_then_close(run: TrainingRun) -> None:  # the restarted server's weights, before it stops
        server = run.generator.server
        seen["pids"].append(server.process.pid)
        seen["children"] += descendants(server.process.pid)
        seen["served"] = server_logprobs(server.url, server.model)
        seen["trainer"] = trainer_logprobs(run.model)
        close(run)

    monkeypatch.setattr(TrainingRun, "log_step", log_then_kill)
    monkeypatch.setattr(TrainingRun, "_play", kill_then_play)
    monkeypatch.setattr(TrainingRun, "close", compare_then_close)
    monkeypatch.setattr(runner, "evaluate_llm", kill_then_evaluate)
    config = load_config(overrides=OVERRIDES)
    torch.manual_seed(0)
    summary = train_grpo(config, tmp_path)

    assert summary["steps"] == 3
    steps = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [step["policy_version"] for step in steps] == [1, 2, 3]  # the restarts kept the trainer's count
    assert [step["vllm/restarts"] for step in steps] == [0, 1, 2]  # one per kill
    assert [step["episode/trained"] for step in steps] == [4, 4, 4]  # step 3 was collected again, whole
    assert [step["episode/dropped"] for step in steps] == [0, 0, 0]
    assert seen["killed_in_eval"]
    assert len(set(seen["pids"])) == 4  # three kills, four server processes
    log = (tmp_path / "vllm-server.log").read_text()
    assert log.count("rl-llm: restarting the vLLM server") == 3  # the log goes on in the same file
    # The evaluation the kill interrupted was played again: every held-out episode ran to its end (a lost
    # episode has no final env metrics: NaN here, and a return of 0 counted as the policy's).
    after = json.loads((tmp_path / "eval_after.json").read_text())["values"]
    assert len(after["return"]) == 2 and set(after) > {"return"}
    assert all(value == value for values in after.values() for value in values), after
    # The restarted server generates with the trainer's weights (pushed at the restart, then by every update).
    assert (seen["served"] - seen["trainer"]).abs().max() < TOLERANCE
    # No engine-core or worker process of a killed (or closed) server outlives the run: a SIGKILL of the server
    # alone leaves them running, holding their memory; the restart and the close stop its process group.
    assert seen["children"], "the servers started no processes: the check below checks nothing"
    assert not alive(seen["children"]), f"processes of the killed servers outlived them: {alive(seen['children'])}"

    # A resume counts on from the checkpoint's restarts (the bound, max_restarts, starts again: a resume is
    # the user's word that the cause is fixed).
    monkeypatch.undo()
    train_grpo(load_config(overrides=[*OVERRIDES, "steps=4"]), tmp_path)
    steps = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [step["step"] for step in steps] == [1, 2, 3, 4]
    assert steps[-1]["vllm/restarts"] == 2  # the two of steps 2-3 (the evaluation's came after the checkpoint)


def test_past_max_restarts_the_cli_stops_with_one_line_naming_the_log_and_the_resume(tmp_path: Path) -> None:
    psutil = pytest.importorskip("psutil", reason="finding the server process needs psutil (a vLLM dependency)")
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "rl_llm.cli", "train", *OVERRIDES, "rollout.vllm.max_restarts=0",
               "--out", str(run_dir)]  # fmt: skip
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "400"})  # fmt: skip
    killed: list[int] = []

    def kill_server_after_step_1() -> None:  # a real kill from outside, while the run goes on
        metrics = run_dir / "metrics.jsonl"
        while process.poll() is None:
            if metrics.exists() and metrics.read_text().strip():
                for child in psutil.Process(process.pid).children(recursive=True):
                    if "--worker-extension-cls" in child.cmdline():
                        child.send_signal(signal.SIGKILL)
                        killed.append(child.pid)
                return
            time.sleep(0.05)

    watcher = threading.Thread(target=kill_server_after_step_1, daemon=True)
    watcher.start()
    try:
        stdout, stderr = process.communicate(timeout=900)
    finally:
        if process.poll() is None:
            process.kill()
    watcher.join(timeout=10)
    assert killed, f"the server was never killed; stdout: {stdout[-2000:]} stderr: {stderr[-2000:]}"
    assert process.returncode == 2, stderr[-3000:]
    assert "Traceback" not in stderr
    errors = [line for line in stdout.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, stdout[-3000:]
    error = errors[0]
    assert "rollout.vllm.max_restarts=0" in error
    assert str(run_dir / "vllm-server.log") in error  # the log, by path, and its last lines
    assert f"rl-llm train {run_dir / 'config.yaml'} --out {run_dir}" in error  # how to resume


def test_a_server_the_user_runs_is_not_restarted_the_run_stops_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rl_llm.agents import tiny_model
    from rl_llm.agents.vllm_server import VLLMServer
    from rl_llm.trainers.config import load_config
    from rl_llm.trainers.grpo import train_grpo
    from rl_llm.trainers.runner import TrainingRun
    from rl_llm.trainers.server_restart import ServerLostError
    from rl_llm.trainers.server_sync import WEIGHT_RECEIVER

    # The user's server: started outside the run (as `VLLM_SERVER_DEV_MODE=1 python -m ...` would be).
    server = VLLMServer(str(tiny_model()), extra_args=["--max-model-len", "4096", "--dtype", "float32",
                        "--kv-cache-memory-bytes", str(512 * 2**20)], log_path=tmp_path / "own-server.log",
                        worker_extension=WEIGHT_RECEIVER)  # fmt: skip
    log_step = TrainingRun.log_step

    def log_then_kill(run: TrainingRun, step: int, *args: Any, **kwargs: Any) -> None:
        log_step(run, step, *args, **kwargs)
        if step == 1:
            sigkill(server.process)

    monkeypatch.setattr(TrainingRun, "log_step", log_then_kill)
    config = load_config(overrides=[*OVERRIDES, f"rollout.vllm.server_url={server.url}"])
    try:
        with pytest.raises(ServerLostError) as lost:
            train_grpo(config, tmp_path / "run")
    finally:
        server.close()
    message = str(lost.value)
    assert "\n" not in message
    assert f"the vLLM server at {server.url}/v1 does not answer /health" in message
    assert "this run did not start it, so it does not restart it" in message
    assert f"rl-llm train {tmp_path / 'run' / 'config.yaml'} --out {tmp_path / 'run'}" in message
    assert server.process.returncode == -signal.SIGKILL  # nobody started it again
