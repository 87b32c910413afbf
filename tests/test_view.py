"""`rl-llm view`: a real (short) training run through the command line, its page loaded in headless
Chromium, and the rendered DOM and a screenshot checked against the run's own files."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rl_llm.types import TokenRole, Trajectory, Turn
from rl_llm.view import Decoder, load, write_view
from tests.cli_env import cli_env

LONG = "a-directory-name-long-enough-that-any-80-column-wrap-would-split-the-path-in-two"


def rl_llm(*args: str) -> subprocess.CompletedProcess[str]:
    # No COLUMNS: through a pipe rich assumes 80 columns, which is what must not break messages.
    return subprocess.run([sys.executable, "-m", "rl_llm.cli", *args], capture_output=True, text=True, timeout=900,
                          env=cli_env(HOME=str(Path.home())))


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if path := shutil.which(name):
            return path
    pytest.skip("needs a headless Chromium to load the page: apt-get install chromium")


def browse(page: Path, tmp: Path, *extra: str) -> str:
    """Load `page` from file:// in headless Chromium with networking off; returns stdout (e.g. --dump-dom)."""
    argv = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-dev-shm-usage", f"--user-data-dir={tmp / 'chromium-profile'}", "--window-size=1280,2000",
            *extra, page.resolve().as_uri()]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two GRPO steps of the default job on the tiny model: metrics, summary, samples and the model."""
    out = tmp_path_factory.mktemp("view") / LONG / "run"
    result = rl_llm("train", "steps=2", "eval.episodes=2", "log.tensorboard=false", "log.plot=false",
                    "--out", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    # Messages with long paths are whole lines (no hard wrap at 80 columns), and no loading bars or
    # unrelated sandbox warnings get into the job's output.
    assert f"run directory: {out}" in lines
    assert any(line.endswith(f"Summary: {out / 'summary.json'}") for line in lines), result.stdout
    assert "Loading weights" not in result.stdout + result.stderr
    assert "SandboxUnavailable" not in result.stdout + result.stderr
    return out


def test_training_keeps_sampled_episodes_for_the_viewer(run_dir: Path) -> None:
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert [s["step"] for s in samples] == [1, 1, 2, 2]
    for sample in samples:
        assert Trajectory.from_json(json.dumps({k: v for k, v in sample.items() if k != "step"})).turns
    # best and worst return of the step first
    assert samples[0]["total_reward"] >= samples[1]["total_reward"]


def test_run_page_renders_curves_summary_and_episodes_in_chromium(run_dir: Path, tmp_path: Path) -> None:
    result = rl_llm("view", str(run_dir))
    assert result.returncode == 0, result.stderr
    page = run_dir / "view.html"
    assert f"wrote {page} " in result.stdout  # the whole path on one line
    text = page.read_text()
    # Self-contained: nothing fetched from anywhere (the only URL is the SVG namespace name).
    assert not re.search(r"""(src|href)\s*=|<link|@import|url\(""", text, re.IGNORECASE)

    dom = browse(page, tmp_path, "--dump-dom")
    assert 'data-rendered="yes"' in dom, "the page's script did not run to the end"
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    plots = re.findall(r'<svg class="plot"[^>]*data-metric="([^"]+)"', dom)
    assert "reward/mean" in plots and len(plots) >= 3
    assert all(name in metrics[0] for name in plots)
    # One line per plot, through every step's point.
    lines = re.findall(r'<path class="line" d="([^"]+)"', dom)
    assert len(lines) == len(plots) and all(d.count("L") == len(metrics) - 1 for d in lines)
    # The summary table, with the before/after rows and the baselines.
    summary = json.loads((run_dir / "summary.json").read_text())
    assert "untrained policy" in dom and "trained (grpo, 2 steps)" in dom
    assert all(f"<td>{name}</td>" in dom for name in summary["baselines"])
    # Every sampled episode, every turn, the invalid ones marked, the tokens coloured by role.
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert dom.count('<details class="episode"') == len(samples)
    turns = [turn for sample in samples for turn in sample["turns"]]
    assert len(re.findall(r'<tr class="turn[ "]', dom)) == len(turns)
    assert dom.count('<tr class="turn invalid"') == sum(turn["invalid_action"] for turn in turns)
    for role in ("prompt", "policy", "env"):
        assert re.search(rf'<span class="tok-{role}" title="{role}: \d+ tokens">', dom), role

    shot = tmp_path / "view.png"
    browse(page, tmp_path, f"--screenshot={shot}")
    image = pytest.importorskip("PIL.Image").open(shot).convert("RGB")
    colours = {colour for _, colour in image.getcolors(maxcolors=1 << 20)}
    # The policy (green) and env (orange) backgrounds of the first episode are on screen.
    assert (0xCD, 0xEC, 0xCD) in colours and (0xFB, 0xE1, 0xC4) in colours


def test_token_spans_decode_back_to_the_whole_episode(run_dir: Path) -> None:
    data = load(run_dir, episodes=2)
    sample = json.loads((run_dir / "samples.jsonl").read_text().splitlines()[-1])
    [episode] = [e for e in data["episodes"] if e["label"].startswith("step 2") and e["seed"] == sample["seed"]
                 and e["group_index"] == sample["group_index"]]
    decoder = Decoder(run_dir / "model")
    assert "".join(text for _, text, _ in episode["spans"]) == decoder.decode(sample["token_ids"])
    counted = {role: sum(n for r, _, n in episode["spans"] if r == role) for role in ("prompt", "policy", "env")}
    assert counted["policy"] == sum(1 for r in sample["token_roles"] if r == TokenRole.POLICY)
    assert counted == episode["token_counts"]


def test_trajectories_jsonl_page_shows_hostile_text_as_text(tmp_path: Path) -> None:
    hostile = "</script><script>document.title='pwned'</script>{{data}}<b>bold?</b>"
    trajectory = Trajectory(
        env_id="rl-llm/TicTacToe-v0", task_id="t0", seed=3,
        messages=[], turns=[Turn(action=hostile, observation="Illegal move.", reward=-0.1, invalid_action=True,
                                 info={"reward_components": {"illegal_move": -0.1}}),
                            Turn(action="<move>B2</move>", observation="", reward=1.0,
                                 info={"reward_components": {"outcome": 1.0}})],
        token_ids=[1, 2, 3], token_roles=[int(TokenRole.PROMPT), int(TokenRole.POLICY), int(TokenRole.ENV)],
        terminated=True, end_reason="terminated",
    )  # fmt: skip
    path = tmp_path / "episodes.trajectories.jsonl"
    path.write_text(trajectory.to_json() + "\n")
    page = write_view(path)
    assert page == tmp_path / "episodes.trajectories.html"
    dom = browse(page, tmp_path, "--dump-dom")
    assert 'data-rendered="yes"' in dom and "pwned" not in dom.split("<title>")[1].split("</title>")[0]
    assert "&lt;/script&gt;&lt;script&gt;document.title" in dom  # shown as text in the action cell
    assert dom.count('<tr class="turn invalid"') == 1 and dom.count('<tr class="turn"') == 1
    assert 'data-metric="episode/return"' in dom  # no metrics.jsonl: the returns are plotted instead
    assert "illegal_move -0.1" in dom


def test_a_baseline_evaluation_is_shown_turn_by_turn(tmp_path: Path) -> None:
    # `rl-llm eval` keeps every agent's trajectories; a baseline's have messages and turns but no tokens.
    out = tmp_path / "minimax.jsonl"
    result = rl_llm("eval", "TicTacToe", "--agent", "minimax", "--episodes", "3", "--out", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    trajectories = out.with_suffix(".trajectories.jsonl")
    data = load(trajectories)
    assert len(data["episodes"]) == 3 and any("rebuilt from the chat messages" in note for note in data["notes"])
    for episode in data["episodes"]:
        assert episode["turns"] and all(turn["action"].startswith("<move>") for turn in episode["turns"])
        assert episode["token_counts"] == {"prompt": 0, "policy": 0, "env": 0} and episode["error"] is None
        assert [span[0] for span in episode["spans"][:3]] == ["prompt", "prompt", "policy"]
    assert write_view(trajectories).stat().st_size > 0


def test_view_explains_what_it_cannot_show(tmp_path: Path) -> None:
    records = tmp_path / "eval.jsonl"
    records.write_text(json.dumps({"env_id": "x", "episode_return": 1.0, "turns": 4}) + "\n")
    (tmp_path / "eval.trajectories.jsonl").write_text("")
    result = rl_llm("view", str(records))
    assert result.returncode == 2 and "episode records, not trajectories" in result.stdout
    assert str(tmp_path / "eval.trajectories.jsonl") in result.stdout
    result = rl_llm("view", str(tmp_path / "empty-run"))
    assert result.returncode == 2 and "no such run directory" in result.stdout


def test_samples_are_cut_back_on_resume_like_the_metrics(tmp_path: Path) -> None:
    from rl_llm.trainers.logging import MetricsWriter

    def episode(reward: float) -> Trajectory:
        return Trajectory(env_id="e", task_id="t", seed=0, turns=[Turn(action="a", observation="", reward=reward)])

    writer = MetricsWriter(tmp_path, tensorboard=False)
    for step in (1, 2, 3):
        writer.log(step, {"reward/mean": float(step)})
        writer.log_samples(step, [episode(0.5), episode(2.0), episode(-1.0)], count=2)
    writer.close()
    with (tmp_path / "samples.jsonl").open("a") as handle:
        handle.write('{"step": 4, "env_id": "torn')  # killed mid-line
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()[:-1]]
    assert [(s["step"], s["total_reward"]) for s in samples] == [(1, 2.0), (1, -1.0), (2, 2.0), (2, -1.0),
                                                                 (3, 2.0), (3, -1.0)]
    MetricsWriter(tmp_path, resume_step=2, tensorboard=False).close()
    kept = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [s["step"] for s in kept] == [1, 1, 2, 2]


def test_summary_table_names_the_policies_as_the_trainer_does() -> None:
    # A warm-started run: `before` is the policy after SFT (the CLI's "after SFT" row), `untrained` the one
    # before it; without a warm start `before` is the untrained policy.
    from rl_llm.view import summary_html

    warm = {"algorithm": "grpo", "steps": 3, "untrained": {"return": -9.5}, "before": {"return": 1.25},
            "after": {"return": 3.75}}  # fmt: skip
    rows = re.findall(r"<tr><td>([^<]*)</td><td class=num>([^<]*)</td>", summary_html(warm))
    assert rows == [("untrained policy", "-9.500"), ("after SFT", "1.250"), ("trained (grpo, 3 steps)", "3.750")]
    cold = {**warm, "untrained": None}
    rows = re.findall(r"<tr><td>([^<]*)</td><td class=num>([^<]*)</td>", summary_html(cold))
    assert rows == [("untrained policy", "1.250"), ("trained (grpo, 3 steps)", "3.750")]


@pytest.mark.parametrize("content", ["", "\n\n", "not json\n[1, 2]\n"])
def test_view_of_a_file_with_no_valid_record_fails_and_writes_no_page(content: str, tmp_path: Path) -> None:
    path = tmp_path / "broken.jsonl"
    path.write_text(content)
    result = rl_llm("view", str(path))
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"{path} holds no valid record" in result.stdout and "Traceback" not in result.stderr
    assert not path.with_suffix(".html").exists() and not list(tmp_path.glob("*.html"))


def test_hostile_records_still_make_a_page_that_renders(tmp_path: Path) -> None:
    """A record whose turns are no objects is skipped (an AttributeError before); NaN, an integer past float's
    range, a lone surrogate, an info that is no object and a list group_id are shown plainly: NaN made
    JSON.parse fail, so the page showed nothing, the surrogate failed the write, the list a TypeError."""
    good = json.loads(Trajectory(env_id="e", task_id="t", seed=0, turns=[Turn(action="a", observation="o",
                                                                              reward=1.0)]).to_json())  # fmt: skip
    hostile = {**good, "total_reward": 10**400, "metrics": {"regret": float("nan")}, "token_roles": 7,
               "turns": [{"action": "lone \ud800", "observation": "", "reward": float("nan"), "info": "x"}]}
    path = tmp_path / "hostile.jsonl"
    seats = [{**good, "seat": seat, "group_id": ["a"]} for seat in ("player_0", "player_1")]  # unhashable
    path.write_text("".join(json.dumps(record) + "\n" for record in (good, {**good, "turns": [1]}, hostile, *seats)))
    result = rl_llm("view", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    dom = browse(path.with_suffix(".html"), tmp_path, "--dump-dom")
    assert 'data-rendered="yes"' in dom and "lone \ufffd" in dom


@pytest.mark.parametrize(("summary", "message"), [
    ("{torn", "summary.json is not JSON (Expecting property name"),  # no file named before
    ("[1, 2]", "summary.json holds a JSON list, not an object"),  # AttributeError before
    ('{"baselines": [1], "model_path": 5, "after": {"return": 1.0}}', None),  # a page; AttributeError before
])  # fmt: skip
def test_a_summary_that_is_no_json_object_is_named(summary: str, message: str | None, tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.5}\n')
    (tmp_path / "summary.json").write_text(summary)
    result = rl_llm("view", str(tmp_path))
    if message is None:
        assert result.returncode == 0 and (tmp_path / "view.html").is_file(), result.stdout + result.stderr
        return
    assert result.returncode == 2 and message in result.stdout, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "view.html").exists()


@pytest.mark.parametrize(("source", "out"), [
    ("episodes.jsonl", "episodes.jsonl"),
    ("episodes.html", None),  # a trajectories file named .html: the default page was the file itself
    (".", "metrics.jsonl"),
])  # fmt: skip
def test_the_page_never_replaces_what_it_shows(source: str, out: str | None, tmp_path: Path) -> None:
    line = Trajectory(env_id="e", task_id="t", seed=0, turns=[Turn(action="a", observation="", reward=1.0)]).to_json()
    for name in ("episodes.jsonl", "episodes.html", "metrics.jsonl"):
        (tmp_path / name).write_text(line + "\n" if name != "metrics.jsonl" else '{"step": 1}\n')
    before = {path: path.read_bytes() for path in tmp_path.iterdir()}
    result = rl_llm("view", str(tmp_path / source), *(("--out", str(tmp_path / out)) if out else ()))
    assert result.returncode == 2 and "is what is being read; name another output with --out" in result.stdout, \
        result.stdout + result.stderr  # fmt: skip
    assert {path: path.read_bytes() for path in tmp_path.iterdir()} == before


def test_a_tokenizer_that_is_not_there_is_an_error_not_ignored(tmp_path: Path) -> None:
    path = tmp_path / "episodes.jsonl"
    path.write_text(Trajectory(env_id="e", task_id="t", seed=0).to_json() + "\n")
    result = rl_llm("view", str(path), "--tokenizer", str(tmp_path / "no-model"))
    assert result.returncode == 2 and f"--tokenizer {tmp_path / 'no-model'}: no such model directory" in result.stdout


def test_a_metrics_line_that_is_no_object_is_skipped_not_a_crash(tmp_path: Path) -> None:
    """A JSON line that is not an object (``[]``, ``5``, ``null``) was an AttributeError out of the page's reader."""
    lines = ['{"step": 1, "reward/mean": 0.5}', "[]", "5", "null", '"text"', "[" * 100_000, '{"step": 2, "reward/mean": 1}']
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    result = rl_llm("view", str(tmp_path))
    assert result.returncode == 0 and (tmp_path / "view.html").is_file(), result.stdout + result.stderr
    assert [record["step"] for record in load(tmp_path)["metrics"]] == [1, 2]


def test_a_tokenizer_folder_without_a_tokenizer_is_an_error_not_replaced(tmp_path: Path) -> None:
    """It was passed over for the run's own tokenizer, and the page said it decoded with that one."""
    path = tmp_path / "episodes.jsonl"
    path.write_text(Trajectory(env_id="e", task_id="t", seed=0).to_json() + "\n")
    (tmp_path / "empty").mkdir()
    result = rl_llm("view", str(path), "--tokenizer", str(tmp_path / "empty"))
    assert result.returncode == 2 and "no tokenizer.json or tokenizer_config.json there" in result.stdout

