"""``rl-llm train [CONFIG] [key=value ...] [--out DIR]``: load the config, pick the loop, run it.

Without CONFIG the embedded default job runs (``default_job.DEFAULT_JOB``); overrides apply to it as well.
Running again with the same ``--out`` resumes from that run's last checkpoint.
"""

from __future__ import annotations

import time
from pathlib import Path

from rich.markup import escape

from rl_llm.console import make_console
from rl_llm.errors import RLLMError
from rl_llm.trainers.config import ConfigError, TrainConfig, load_config
from rl_llm.trainers.default_job import DEFAULT_JOB, describe_default_job

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


def train_main(config_path: str | None, overrides: list[str], out: str | None = None) -> int:
    if config_path is not None and "=" in config_path and not Path(config_path).exists():
        # `rl-llm train steps=10`: the command line's first positional is a key=value, not a file.
        config_path, overrides = None, [config_path, *overrides]
    try:
        config = load_config(config_path, overrides, base=None if config_path else DEFAULT_JOB)
    except ConfigError as error:
        console.print(f"[red]error:[/red] {escape(str(error))}", highlight=False)
        return 2
    run_dir = Path(out or config.out_dir or Path("runs") / time.strftime("%Y%m%d-%H%M%S"))
    if config_path is None:
        console.print(describe_default_job(config), highlight=False)
    console.print(f"run directory: {run_dir}", highlight=False)
    try:
        summary = run_training(config, run_dir)
    except (RLLMError, FileNotFoundError, ImportError) as error:  # e.g. a GPU this machine lacks, no model, no vLLM
        console.print(f"[red]error:[/red] {escape(str(error))}", highlight=False)
        return 2
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
