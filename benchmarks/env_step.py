"""Microseconds per ``env.step`` for every rl-llm environment, against bare game logic and peer suites.

For the bandits and tic-tac-toe, a "bare" implementation does the same game logic by hand with no framework
(parse the action tag, update the state, sample the reward or the opponent's move, write the same
observation text) and is timed in the same run; the ratio ``env / bare`` is the cost of the environment
layer (Gymnasium wrappers, the info contract, metrics, the transcript). Target: at most 3x.

Where the peer suites are installed (``pip install textarena gem-llm``), their tic-tac-toe is timed in the
same run with random legal moves. A TextArena step is one player's move while an rl-llm step is the agent's
move plus the built-in opponent's reply, so the fair comparison is per move; both figures are printed.
Target: rl-llm at least 5x faster.

``step`` and ``reset`` calls are timed (resets amortised over their episode's steps); choosing the action is
not, for every contender.

    python benchmarks/env_step.py [--steps 30000] [--rounds 5] [--only TextToSQL]
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable

import gymnasium as gym

import rl_llm  # noqa: F401
from rl_llm.envs.registration import env_ids
from rl_llm.envs.tictactoe.rules import CELL_NAMES, LINES

Timer = tuple[Callable[[int], None], Callable[[], bool], Callable[[], None]]


def time_steps(timer: Timer, steps: int) -> tuple[float, float]:
    """Mean seconds per step over ``steps`` steps: ``step`` calls alone, and with the resets amortised over
    their episodes (an env may do per-episode work at reset). ``step`` returns True at episode end;
    ``prepare`` (which picks the next action, standing in for the agent) is not timed."""
    reset, step, prepare = timer
    step_time = reset_time = 0.0
    done = episode = 0
    start = time.perf_counter()
    reset(episode)
    reset_time += time.perf_counter() - start
    while done < steps:
        prepare()
        start = time.perf_counter()
        ended = step()
        step_time += time.perf_counter() - start
        done += 1
        if ended:
            episode += 1
            start = time.perf_counter()
            reset(episode)
            reset_time += time.perf_counter() - start
    return step_time / done, (step_time + reset_time) / done


# --- rl-llm environments ------------------------------------------------------------------------------
def rl_llm_env_timer(env_id: str) -> Timer:
    env = gym.make(env_id)
    inner = env.unwrapped
    labels = [f"<action>{label}</action>" for label in "ABCDEFGHIJ"]
    counter = [0]

    def action() -> str:
        if env_id.endswith("TicTacToe-v0"):
            legal = [i for i, mark in enumerate(inner.board) if mark == "."]
            return f"<move>{CELL_NAMES[legal[counter[0] % len(legal)]]}</move>"
        return labels[counter[0] % inner.num_arms] if hasattr(inner, "num_arms") else "<answer>0</answer>"

    pending = [""]

    def prepare() -> None:
        pending[0] = action()
        counter[0] += 1

    def step() -> bool:
        _, _, terminated, truncated, _ = env.step(pending[0])
        return terminated or truncated

    return lambda episode: env.reset(seed=episode), step, prepare


# --- bare game logic ----------------------------------------------------------------------------------
class BareBandit:
    """Bernoulli bandit, summary observation, no framework."""

    def __init__(self, num_arms: int = 5, horizon: int = 50) -> None:
        self.num_arms, self.horizon, self.labels = num_arms, horizon, "ABCDE"[:num_arms]

    def reset(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.means = [self.rng.random() for _ in range(self.num_arms)]
        self.counts, self.sums, self.t, self.regret = [0] * self.num_arms, [0.0] * self.num_arms, 0, 0.0

    def step(self, action: str) -> tuple[str, float, bool]:
        start = action.rfind("<action>")
        end = action.find("</action>", start)
        label = action[start + 8 : end].strip().upper()
        arm = self.labels.index(label) if len(label) == 1 and label in self.labels else self.rng.randrange(self.num_arms)
        reward = 1.0 if self.rng.random() < self.means[arm] else 0.0
        self.counts[arm] += 1
        self.sums[arm] += reward
        self.t += 1
        self.regret += max(self.means) - self.means[arm]
        lines = [f"Arm {label} gave reward {int(reward)}.", f"Pull {self.t + 1} of {self.horizon}. Arms: A, B, C, D, E."]
        for lab, count, total in zip(self.labels, self.counts, self.sums):
            lines.append(f"{lab}: {count} pulls, mean reward {total / count:.3f}" if count else f"{lab}: 0 pulls")
        lines.append("Which arm do you pull next?")
        return "\n".join(lines), reward, self.t >= self.horizon


class BareContextualBandit:
    """Linear contextual bandit with the full history in the observation, no framework."""

    def __init__(self, num_arms: int = 4, dim: int = 3, horizon: int = 50) -> None:
        self.num_arms, self.dim, self.horizon, self.labels = num_arms, dim, horizon, "ABCD"[:num_arms]

    def reset(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.theta = [[self.rng.gauss(0, 1) for _ in range(self.dim)] for _ in range(self.num_arms)]
        self.t, self.regret, self.history = 0, 0.0, []
        self.draw_context()

    def draw_context(self) -> None:
        self.context = [round(self.rng.uniform(-1, 1), 2) for _ in range(self.dim)]
        self.means = [sum(w * x for w, x in zip(row, self.context)) for row in self.theta]
        self.context_text = "[" + ", ".join(f"{x:.2f}" for x in self.context) + "]"

    def step(self, action: str) -> tuple[str, float, bool]:
        start = action.rfind("<action>")
        label = action[start + 8 : action.find("</action>", start)].strip().upper()
        arm = self.labels.index(label) if len(label) == 1 and label in self.labels else 0
        reward = self.means[arm] + self.rng.gauss(0, 0.1)
        self.regret += max(self.means) - self.means[arm]
        self.history.append(f"{self.context_text} -> {label}: {reward:.3f}")
        self.t += 1
        self.draw_context()
        lines = [f"Arm {label} gave reward {reward:.3f}.", f"Pull {self.t + 1} of {self.horizon}. Arms: A, B, C, D.",
                 "History (context -> arm: reward):", *self.history, f"Current context: {self.context_text}",
                 "Which arm do you pull next?"]
        return "\n".join(lines), reward, self.t >= self.horizon


class BareTicTacToe:
    """Agent X against a random opponent, no framework."""

    def reset(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.board = ["."] * 9

    def winner(self) -> str | None:
        for a, b, c in LINES:
            if self.board[a] != "." and self.board[a] == self.board[b] == self.board[c]:
                return self.board[a]
        return "draw" if "." not in self.board else None

    def step(self, action: str) -> tuple[str, float, bool]:
        start = action.rfind("<move>")
        end = action.find("</move>", start)
        text = action[start + 6 : end].strip().upper()
        cell = "ABC".index(text[0]) * 3 + int(text[1]) - 1 if len(text) == 2 and text[0] in "ABC" else -1
        if cell < 0 or self.board[cell] != ".":
            return "Illegal move.", -0.1, False
        self.board[cell] = "X"
        result = self.winner()
        if result is None:
            legal = [i for i, mark in enumerate(self.board) if mark == "."]
            self.board[self.rng.choice(legal)] = "O"
            result = self.winner()
        rows = ["  1 2 3"] + [f"{'ABC'[r]} " + " ".join(self.board[3 * r : 3 * r + 3]) for r in range(3)]
        legal_names = ", ".join(CELL_NAMES[i] for i, mark in enumerate(self.board) if mark == ".")
        observation = "\n".join([*rows, "You play X.", f"Legal moves: {legal_names}", "Your move?"])
        reward = {"X": 1.0, "O": -1.0}.get(result or "", 0.0)
        return observation, reward, result is not None


def bare_timer(game: BareBandit | BareContextualBandit | BareTicTacToe) -> Timer:
    pending = [""]
    counter = [0]

    def action() -> str:
        if isinstance(game, (BareBandit, BareContextualBandit)):
            return f"<action>{game.labels[counter[0] % game.num_arms]}</action>"
        legal = [i for i, mark in enumerate(game.board) if mark == "."]
        return f"<move>{CELL_NAMES[legal[counter[0] % len(legal)]]}</move>"

    def prepare() -> None:
        pending[0] = action()
        counter[0] += 1

    return game.reset, lambda: game.step(pending[0])[2], prepare


# --- peer suites --------------------------------------------------------------------------------------
def textarena_timer() -> Timer | None:
    try:
        import textarena as ta
    except ImportError:
        return None
    env = ta.make("TicTacToe-v0-raw")
    rng = random.Random(0)
    pending = [""]

    def action() -> str:
        board = env.state.game_state["board"]
        legal = [r * 3 + c for r in range(3) for c in range(3) if board[r][c] == ""]
        return f"[{rng.choice(legal)}]"

    def step() -> bool:
        env.get_observation()  # what an agent loop does before each move
        done, _ = env.step(action=pending[0])
        return done

    def prepare() -> None:
        pending[0] = action()

    return lambda episode: env.reset(num_players=2, seed=episode), step, prepare


def interleaved(timers: dict[str, Timer], steps: int, rounds: int) -> dict[str, tuple[float, float]]:
    """Microseconds per step (step only, with resets) of each contender: rounds alternate between contenders
    so background load hits them alike, and the best round counts (the least disturbed one)."""
    best = dict.fromkeys(timers, (float("inf"), float("inf")))
    for _ in range(rounds):
        for name, timer in timers.items():
            step_only, with_reset = time_steps(timer, steps // rounds)
            best[name] = (min(best[name][0], step_only * 1e6), min(best[name][1], with_reset * 1e6))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30000, help="steps per contender (split over rounds)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", default="", help="time only the environments whose id contains this text")
    args = parser.parse_args()

    bare = {"rl-llm/MultiArmedBandit-v0": BareBandit(), "rl-llm/ContextualBandit-v0": BareContextualBandit(),
            "rl-llm/TicTacToe-v0": BareTicTacToe()}
    print("us per step: 'step' times env.step alone, '+reset' adds the resets amortised over each episode.")
    print(f"{'environment':30s} {'step':>7s} {'+reset':>7s} {'bare':>6s} {'+reset':>7s} {'ratio':>6s} {'+reset':>7s}")
    results: dict[str, tuple[float, float]] = {}
    for env_id in [env_id for env_id in env_ids() if args.only in env_id]:
        steps = args.steps if env_id in bare or "Bandit" in env_id else max(200, args.steps // 100)
        timers = {"env": rl_llm_env_timer(env_id)}
        if env_id in bare:
            timers["bare"] = bare_timer(bare[env_id])
        if env_id.endswith("TicTacToe-v0") and (peer := textarena_timer()) is not None:
            timers["textarena"] = peer
        us = interleaved(timers, steps, args.rounds)
        results.update({env_id: us["env"], **({"textarena": us["textarena"]} if "textarena" in us else {})})
        line = f"{env_id:30s} {us['env'][0]:7.1f} {us['env'][1]:7.1f}"
        if "bare" in us:
            ratios = [us["env"][i] / us["bare"][i] for i in (0, 1)]
            line += f" {us['bare'][0]:6.1f} {us['bare'][1]:7.1f} {ratios[0]:5.2f}x {ratios[1]:6.2f}x  (target <= 3x)"
        print(line)

    if "textarena" not in results:
        print("\ntextarena not installed: `pip install textarena` to compare")
    else:
        (ta_step, ta_reset), (ours_step, ours_reset) = results["textarena"], results["rl-llm/TicTacToe-v0"]
        print(f"\nTextArena TicTacToe-v0: {ta_step:.1f} us per step, {ta_reset:.1f} with resets (one player's move)")
        print(f"rl-llm TicTacToe-v0:    {ours_step:.1f} us per step, {ours_reset:.1f} with resets "
              "(the agent's move and the opponent's reply)")
        print(f"rl-llm speed-up per agent turn (= two TextArena steps): {2 * ta_step / ours_step:.1f}x step only, "
              f"{2 * ta_reset / ours_reset:.1f}x with resets  (target >= 5x)")
    try:
        import gem  # noqa: F401

        print("gem-llm is installed but ships no tic-tac-toe environment (its game envs: GuessTheNumber, "
              "Mastermind, Minesweeper, Wordle, ...), so there is nothing like-for-like to time.")
    except ImportError:
        print("gem-llm not installed: `pip install gem-llm` to check for a comparable env")


if __name__ == "__main__":
    main()
