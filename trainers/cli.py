"""``rl-llm train [CONFIG] [key=value ...] [--out DIR]``: load the config, pick the loop, run it.

Without CONFIG the embedded default job runs (``default_job.DEFAULT_JOB``); overrides apply to it as well.
Running again with the same ``--out`` resumes from that run's last checkpoint.
"""

from __future__ import annotations

import shlex
import time
from pathlib import Path

import yaml
from rich.markup import escape

from rl_llm.console import make_console
from rl_llm.errors import RLLMError
from rl_llm.paths import is_training_run, yaml_problem
from rl_llm.trainers.config import (
    ConfigError,
    TrainConfig,
    check_overrides_unique,
    config_to_dict,
    load_config,
)
from rl_llm.trainers.default_job import DEFAULT_JOB, describe_default_job
from rl_llm.trainers.trackers import flatten

console = make_console()  # messages never hard-wrap in pipes and logs


def run_training(config: TrainConfig, run_dir: str | Path) -> dict:
    if config.algorithm == "ppo":
        from rl_llm.trainers.ppo import train_ppo

        return train_ppo(config, run_dir)
    if config.rollout.max_staleness is not None:
        from rl_llm.trainers.async_grpo import train_async_grpo

        return train_async_grpo(config, run_dir)
    from rl_llm.trainers.grpo import train_grpo

    return train_grpo(config, run_dir)


# What a resumed run must share with the run in its directory: otherwise the checkpoint does not fit the model
# (LoRA, another model, PPO's critic) or the logs and summary would mix two runs (another env, held-out seeds that
# eval_before.json no longer measures). Other keys (steps, logging, devices, ...) may change on a resume.
RUN_IDENTITY = ("algorithm", "env", "model.path", "model.lora", "eval.seed", "eval.episodes")


def resume_command(run_dir: Path) -> str:
    return f"rl-llm train {shlex.quote(str(run_dir / 'config.yaml'))} --out {shlex.quote(str(run_dir))}"


def check_run_dir(config: TrainConfig, run_dir: Path) -> None:
    """``run_dir`` can hold this run: a directory (or none yet); one with a checkpoint is resumed only by the
    same run (``RUN_IDENTITY``), never overwritten by, or mixed with, another."""
    # lazy: torch; a config error is reported before it loads
    from rl_llm.trainers.checkpoint import Checkpointer

    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"--out {run_dir} is a file, not a directory; choose another --out")
    saved_path = run_dir / "config.yaml"
    if Checkpointer(run_dir / "checkpoints").latest() is None or not saved_path.is_file():
        # A new run, or one stopped before its first checkpoint (it starts over). Any other directory with
        # files in it (a home or project folder) is not the trainer's: its config.yaml, summary.json, model/...
        # would overwrite a person's files of those names and mix the run's among the rest.
        if run_dir.is_dir() and any(run_dir.iterdir()) and not is_training_run(run_dir):
            raise ConfigError(f"--out {run_dir} is a non-empty directory that holds no training run (no config.yaml "
                              "saved by rl-llm train); choose a new or empty --out")
        return
    try:
        saved = yaml.safe_load(saved_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        why = yaml_problem(error) if isinstance(error, yaml.YAMLError) else str(error)  # PyYAML's is several lines
        raise ConfigError(f"--out {run_dir} holds a checkpoint but its config.yaml cannot be read ({why}); "
                          "choose a new --out") from error
    before, after = flatten(saved if isinstance(saved, dict) else {}), flatten(config_to_dict(config))
    for key in sorted(before.keys() | after.keys()):
        if _in_run_identity(key) and before.get(key) != after.get(key):
            raise ConfigError(f"--out {run_dir} holds a run with {key}={before.get(key)!r}, not {after.get(key)!r}: "
                              f"resume it unchanged with `{resume_command(run_dir)}`, or choose a new --out")


def _in_run_identity(key: str) -> bool:
    """``env.kwargs.num_arms`` is under ``env``; ``environment`` would not be (whole dotted parts only)."""
    return any(key == part or key.startswith(f"{part}.") for part in RUN_IDENTITY)


def interrupted_message(run_dir: Path) -> str:
    from rl_llm.trainers.checkpoint import Checkpointer

    latest = Checkpointer(run_dir / "checkpoints").latest()
    if latest is None:
        return (f"interrupted before the first checkpoint (log.checkpoint_every); running again with --out {run_dir} "
                "starts over")
    return (f"interrupted; {run_dir} keeps the checkpoint of step {int(latest.name.removeprefix('step_'))} "
            f"({latest}). Resume with: {resume_command(run_dir)}")


def train_main(config_path: str | None, overrides: list[str], out: str | None = None, *,
               command_line: bool = False) -> int:
    """``rl-llm train``. ``command_line``: the overrides were typed by a person, so a key given twice is refused
    (code calling this may layer specifics over a base list of overrides: the later one wins)."""
    if config_path is not None and "=" in config_path and not Path(config_path).exists():
        # `rl-llm train steps=10`: the command line's first positional is a key=value, not a file.
        config_path, overrides = None, [config_path, *overrides]
    try:
        if command_line:
            check_overrides_unique(overrides)
        config = load_config(config_path, overrides, base=None if config_path else DEFAULT_JOB)
    except ConfigError as error:
        console.print(f"[red]error:[/red] {escape(str(error))}", highlight=False)
        return 2
    run_dir = Path(out or config.out_dir or Path("runs") / time.strftime("%Y%m%d-%H%M%S"))
    try:
        check_run_dir(config, run_dir)
    except ConfigError as error:
        console.print(f"[red]error:[/red] {escape(str(error))}", highlight=False)
        return 2
    if config_path is None:
        console.print(describe_default_job(config), highlight=False)
    console.print(f"run directory: {run_dir}", highlight=False)
    try:
        summary = run_training(config, run_dir)
    except (RLLMError, FileNotFoundError, ImportError) as error:  # e.g. a GPU this machine lacks, no model, no vLLM
        console.print(f"[red]error:[/red] {escape(str(error))}", highlight=False)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: checkpoints on disk are whole (trainers/checkpoint.py); say how to go on
        console.print(f"\n{interrupted_message(run_dir)}", highlight=False)
        return 130
    except RuntimeError as error:
        from rl_llm.trainers.modeling import nondeterminism_message  # torch is loaded by now

        message = nondeterminism_message(error)
        if message is None:
            raise
        console.print(f"[red]error:[/red] {escape(message)}", highlight=False)
        return 2
    console.print(
        f"mean return on {config.eval.episodes} held-out seeds: {summary['return_before']:.3f} before, "
        f"{summary['return_after']:.3f} after {summary['steps']} steps "
        f"(random baseline {summary['baseline_random']:.3f}). Summary: {run_dir / 'summary.json'}",
        highlight=False,
    )
    return 0
