"""Text2SQL on real SQLite databases, multi-turn (SkyRL-SQL) or single-turn (Think2SQL)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rl_llm import checks
from rl_llm.envs.base import Outcome, Task, TextEnv
from rl_llm.envs.parsing import first_of_tags
from rl_llm.envs.sql.database import QueryLimits
from rl_llm.envs.sql.generator import generate_tasks
from rl_llm.envs.sql.render import describe_schema, format_result
from rl_llm.envs.sql.rewards import (
    DEFAULT_PROTOCOL,
    FORMAT_RULES,
    PRESET_PROTOCOLS,
    RESULT_MATCHES,
    REWARD_NAMES,
    resolve_weights,
    skyrl_format,
    thinks_before_action,
)
from rl_llm.envs.sql.scoring import DatabasePool, SqlScorer
from rl_llm.envs.sql.tasks import SqlTask, load_chinook_tasks, load_spider_tasks

MODES = ("multi", "single")
INVALID_MULTI = (
    "Your previous action is invalid. Think inside <think>...</think>, then either run one SQL query inside "
    "<sql>...</sql> or give your final SQL query inside <solution>...</solution>, and try again."
)
INVALID_SINGLE = "No answer found: the final SQL query must be inside <solution>...</solution>."
SYSTEM_MULTI = (
    "You are a data analyst. Answer the user's question about a SQLite database with one SQL query.\n"
    "Each turn, first think step by step inside <think>...</think>. Then do exactly one of:\n"
    "- run one exploratory query inside <sql>...</sql>; its result comes back inside <observation>;\n"
    "- give your final answer: one SQLite query inside <solution>...</solution>, which ends the task.\n"
    "The database is read-only and queries have a time limit. You have {max_turns} turns in total; "
    "your solution is graded by comparing its result with the correct answer's result."
)
SYSTEM_SINGLE = (
    "You are a data analyst. Answer the user's question about a SQLite database with one SQL query.\n"
    "Think step by step inside <think>...</think>, then give your final answer: one SQLite query inside "
    "<solution>...</solution>. Your solution is graded by comparing its result with the correct answer's result."
)


class TextToSQLEnv(TextEnv):
    """
    ## Description
    The agent answers a natural-language question about a relational database with one SQL query, executed
    on a real SQLite file. In ``mode="multi"`` (the SkyRL-SQL protocol) it may first run exploratory queries
    and read their results; in ``mode="single"`` (Think2SQL) it answers in one turn. Tasks come from the
    bundled Chinook music-store database with 53 hand-written questions (easy/medium/hard), from procedurally
    generated databases in four domains (unlimited, seeded), or from a Spider/BIRD-format directory on disk.
    Databases are read-only behind four guards (``mode=ro`` URI, ``query_only``, an authorizer that refuses
    writes/ATTACH/PRAGMA writes/extensions, connection limits), each query has a timeout, results are capped.

    ## Observation
    On reset: the database engine, the schema as CREATE TABLE statements with ``sample_rows`` example rows
    per table, the external knowledge (BIRD ``evidence``) if any, and the question. After an exploratory
    query: ``<observation>`` with the result table (first ``display_rows`` rows within ``display_chars``
    characters) or the error/timeout/refusal message, and a ``<reminder>`` of the turns left.

    ## Action
    One LLM turn: ``<think>...</think>`` then either ``<sql>QUERY</sql>`` (multi mode only) or
    ``<solution>QUERY</solution>``. The earliest complete tag is the action (a generator stops at
    ``</sql>`` or ``</solution>``). A turn with neither is invalid: it gets a corrective observation that
    says how many turns are left.

    ## Rewards
    Terminal only, ``sum(weight * term)`` over the terms of ``reward_weights`` (a preset name or a dict):
    ``execution`` (1 if the solution's result equals the gold result under ``result_match``),
    ``syntax`` (one query that executes), ``schema_linking`` (Jaccard of the tables/columns used, unknown
    ones and ``*``'s columns included), ``ngram`` (Jaccard of token bigrams), ``format`` (every turn thinks
    before acting and exactly one ``<solution>``; SkyRL-SQL's own check under skyrl) and ``format_penalty`` (``format - 1``). The partial terms
    are 0 for a query that does not execute, so it never beats ``SELECT 1``. Presets: ``"execution"``
    (default, weight 1), ``"think2sql"`` (0.85 EX + 0.15 format), ``"reasoning_sql"`` (3 EX + syntax +
    schema linking + n-gram + 0.5 format), ``"skyrl"`` (SkyRL-SQL exactly: -1 whenever the format is broken,
    whatever the result, else EX under set matching, 5 turns). ``result_match``: ``"multiset"`` (every preset
    but skyrl: rows as a multiset, a list when the gold query has a top-level ORDER BY, numbers within
    ``float_tolerance``, column order free) or ``"set"`` (skyrl: ``frozenset(pred) == frozenset(gold)``,
    order and duplicates ignored, column order kept). ``info["reward_components"]`` holds each weighted term;
    ``info["metrics"]`` the raw terms, ``exec_match``, ``sql_queries``, ``query_errors``, ``timeouts``.

    ## Episode End
    Terminated by a ``<solution>``. Truncated after ``max_turns`` turns (multi, default 5 as SkyRL-SQL's env)
    or after the one turn of single mode; an episode without a solution scores 0 on every term
    (``format_penalty`` -1).

    ## Arguments
    - ``dataset`` ("chinook"): ``"chinook"`` or ``"generated"``; ``data_dir`` (None) with ``split`` ("dev")
      loads a Spider/BIRD-format directory instead (``split`` may also name a .json file in it).
    - ``mode`` ("multi"): ``"multi"`` or ``"single"``; ``max_turns`` (None: 5, multi mode only).
    - ``reward_weights`` ("execution"): preset name or ``{term: weight}``.
    - ``result_match`` (None: ``"set"`` under the skyrl preset, else ``"multiset"``), ``format_gate``
      (None: True under skyrl: a broken format makes every term but ``format_penalty`` 0) and ``format_rule``
      (None: ``"skyrl"`` under skyrl, SkyRL-SQL's check of the whole chat: one ``<solution>`` without inner
      tags, a ``<think>`` somewhere, every turn after an ``<observation>`` starting with ``<think>``; else
      ``"every_turn"``: every turn thinks before its action).
    - ``sample_rows`` (3): example rows per table in the schema (0 for none).
    - ``query_timeout_s`` (5.0), ``gold_timeout_s`` (30.0), ``max_result_rows`` (10000), ``max_result_bytes``
      (8 MiB), ``display_rows`` (50), ``display_chars`` (9000), ``float_tolerance`` (1e-6).
    - ``cache_gold_results`` (True): gold results are computed once per task and process.
    - ``generated_databases`` (12, at most 1,000), ``generator_seed`` (0), ``generated_dir`` (None: ``sql-generated`` in
      rl-llm's cache folder, ``$RL_LLM_CACHE`` or ``~/.cache/rl-llm``). A question asked on several
      databases of one domain is kept once (12 databases: 93 tasks).
    - Per episode: ``reset(options={"task_index": i})`` picks a task exactly; otherwise the seed picks one.
      ``len(env.unwrapped.tasks)`` is the number of tasks.

    ## Version History
    - v0.1: the partial terms need a query that executes and schema linking counts unknown items and
      ``*``; the skyrl preset is SkyRL-SQL's (its format check, -1 on any broken format, set matching, 5
      turns); ``result_match``/``format_gate``/``format_rule`` arguments; default ``max_turns`` 5; invalid
      turns say the turns left; generated questions deduplicated.
    - v0: initial release.
    """

    reset_options = frozenset({"task_index"})

    stop = ("</sql>", "</solution>")

    def __init__(
        self,
        dataset: str = "chinook",
        data_dir: str | Path | None = None,
        split: str = "dev",
        mode: str = "multi",
        max_turns: int | None = None,
        reward_weights: str | Mapping[str, float] | None = "execution",
        result_match: str | None = None,
        format_gate: bool | None = None,
        format_rule: str | None = None,
        sample_rows: int = 3,
        query_timeout_s: float = 5.0,
        gold_timeout_s: float = 30.0,
        max_result_rows: int = 10_000,
        max_result_bytes: int = 8 << 20,
        display_rows: int = 50,
        display_chars: int = 9000,
        float_tolerance: float = 1e-6,
        cache_gold_results: bool = True,
        generated_databases: int = 12,
        generator_seed: int = 0,
        generated_dir: str | Path | None = None,
        render_mode: str | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        sample_rows = checks.integer("sample_rows", sample_rows, minimum=0)
        display_rows = checks.integer("display_rows", display_rows, minimum=1)
        display_chars = checks.integer("display_chars", display_chars, minimum=100)
        query_timeout_s = checks.seconds("query_timeout_s", query_timeout_s)
        gold_timeout_s = checks.seconds("gold_timeout_s", gold_timeout_s)
        max_result_rows = checks.integer("max_result_rows", max_result_rows, minimum=1)
        max_result_bytes = checks.integer("max_result_bytes", max_result_bytes, minimum=1)
        float_tolerance = checks.real("float_tolerance", float_tolerance, minimum=0.0)
        cache_gold_results = checks.flag("cache_gold_results", cache_gold_results)
        if format_gate is not None:
            format_gate = checks.flag("format_gate", format_gate)
        # Each generated database is a file built at construction: bounded so a typo cannot fill the disk.
        generated_databases = checks.integer("generated_databases", generated_databases, minimum=1, maximum=1000)
        generator_seed = checks.integer("generator_seed", generator_seed, minimum=0)
        data_dir = checks.optional_path("data_dir", data_dir)
        generated_dir = checks.optional_path("generated_dir", generated_dir)
        protocol = dict(DEFAULT_PROTOCOL)
        if isinstance(reward_weights, str):
            protocol.update(PRESET_PROTOCOLS.get(reward_weights, {}))
        max_turns = int(protocol["max_turns"]) if max_turns is None else max_turns  # type: ignore[call-overload]
        result_match = str(protocol["result_match"]) if result_match is None else result_match
        if result_match not in RESULT_MATCHES:
            raise ValueError(f"result_match must be one of {RESULT_MATCHES}, got {result_match!r}")
        super().__init__(max_turns=1 if mode == "single" else max_turns, render_mode=render_mode)
        self.mode = mode
        self.weights = resolve_weights(reward_weights)
        self.result_match = result_match
        self.format_gate = bool(protocol["format_gate"]) if format_gate is None else format_gate
        self.format_rule = str(protocol["format_rule"]) if format_rule is None else format_rule
        if self.format_rule not in FORMAT_RULES:
            raise ValueError(f"format_rule must be one of {FORMAT_RULES}, got {self.format_rule!r}")
        self.sample_rows = sample_rows
        self.display_rows = display_rows
        self.display_chars = display_chars
        if data_dir is not None:
            self.dataset = f"{Path(data_dir).name}-{Path(split).stem}"
            self.tasks: list[SqlTask] = load_spider_tasks(data_dir, split)
        elif dataset == "chinook":
            self.dataset, self.tasks = "chinook", load_chinook_tasks()
        elif dataset == "generated":
            self.dataset = f"generated{generator_seed}"
            self.tasks = generate_tasks(generated_databases, generator_seed, generated_dir)
        else:
            raise ValueError(f"dataset must be 'chinook' or 'generated' (or pass data_dir=PATH), got {dataset!r}")
        limits = QueryLimits(query_timeout_s, max_result_rows, max_result_bytes)
        self.scorer = SqlScorer(
            limits=limits,
            gold_limits=QueryLimits(gold_timeout_s, max_result_rows, max_result_bytes),
            tolerance=float_tolerance,
            cache_gold=cache_gold_results,
            pool=DatabasePool(),
            result_match=result_match,
        )
        self._schemas: dict[Path, str] = {}
        self.current_task: SqlTask | None = None
        self.task_index = -1
        self.first_observation = ""
        self._queries = self._errors = self._timeouts = 0
        self._well_formatted = True

    # -- episode ------------------------------------------------------------------------------------------
    def _reset(self, options: dict[str, Any]) -> Task:
        index = self._choose_task_index(options, len(self.tasks))
        task = self.current_task = self.tasks[index]
        self.task_index = index
        self._queries = self._errors = self._timeouts = 0
        self._well_formatted = True
        self._chat = ""  # the policy's turns and the observations between them (SkyRL's format check)
        self.first_observation = self._task_text(task)
        template = SYSTEM_SINGLE if self.mode == "single" else SYSTEM_MULTI
        return Task(
            observation=self.first_observation,
            task_id=f"TextToSQL-{self.dataset}-{task.task_id}",
            system_prompt=template.format(max_turns=self.max_turns),
            info={"db_id": task.db_id, "task_index": index, "difficulty": task.difficulty},
        )

    def _task_text(self, task: SqlTask) -> str:
        if task.db_path not in self._schemas:
            database = self.scorer.pool.get(task.db_path)
            self._schemas[task.db_path] = describe_schema(database, self.sample_rows, self.scorer.gold_limits)
        parts = ["Database engine: SQLite", f"Database schema:\n{self._schemas[task.db_path]}"]
        if task.evidence:
            parts.append(f"External knowledge: {task.evidence}")
        parts.append(f"Question: {task.question}")
        return "\n\n".join(parts)

    def _step(self, action: str) -> Outcome:
        self._chat += action
        outcome = self._play(action)
        self._chat += outcome.observation
        return outcome

    def _play(self, action: str) -> Outcome:
        tags = ("solution",) if self.mode == "single" else ("sql", "solution")
        found = first_of_tags(action, tags)
        if found is None:
            self._well_formatted = False
            if self.turn >= self.max_turns:
                outcome = self._final(None)
                outcome.invalid_action = True
                return outcome
            return Outcome(
                observation=self._invalid_message(),
                rewards=self._zero_rewards(),
                invalid_action=True,
                metrics=self._running_metrics(),
            )
        tag, sql = found
        self._well_formatted &= thinks_before_action(action, tag)
        if tag == "solution":
            self._well_formatted &= action.count("<solution>") == 1
            return self._final(sql)
        return self._explore(sql)

    def _explore(self, sql: str) -> Outcome:
        assert self.current_task is not None
        result = self.scorer.run(self.current_task, sql)
        self._queries += 1
        self._errors += not result.ok
        self._timeouts += result.timed_out
        if self.turn >= self.max_turns:
            return self._final(None)
        reminder = self._turns_left()
        text = format_result(result, self.display_rows, self.display_chars)
        return Outcome(
            observation=f"<observation>{text}\n<reminder>{reminder}</reminder></observation>",
            rewards=self._zero_rewards(),
            metrics=self._running_metrics(),
        )

    def _invalid_message(self) -> str:
        if self.mode == "single":
            return INVALID_SINGLE
        # As SkyRL-SQL words it: an observation with the turns left (so its format rule, "after an
        # </observation> the turn starts with <think>", covers the turn after an invalid one too).
        return f"<observation>{INVALID_MULTI}\n<reminder>{self._turns_left()}</reminder></observation>"

    def _turns_left(self) -> str:
        left = self.max_turns - self.turn
        reminder = f"You have {left} turn{'s' if left != 1 else ''} left to complete the task."
        if left == 1:
            reminder += " Give your final answer in <solution>...</solution> now."
        return reminder

    def _final(self, sql: str | None) -> Outcome:
        """Terminal step: score the solution (or its absence) and end the episode."""
        assert self.current_task is not None
        raw = dict.fromkeys(REWARD_NAMES, 0.0)
        metrics = self._running_metrics()
        if sql is None:
            message = "The episode ended without a <solution>."
        else:
            scores = self.scorer.score(self.current_task, sql, self.weights)
            raw.update(scores.values)
            # The partial terms that were computed (execution is reported as exec_match).
            metrics.update({name: value for name, value in scores.values.items() if name != "execution"})
            verdict = "matches" if raw["execution"] == 1.0 else "does not match"
            message = " ".join([f"Your solution's result {verdict} the expected result.", *scores.notes])
        well_formatted = skyrl_format(self._chat) if self.format_rule == "skyrl" else self._well_formatted
        raw["format"] = float(sql is not None and well_formatted)
        raw["format_penalty"] = raw["format"] - 1.0
        exec_match = raw["execution"]  # the metric reports the result match even when the gate zeroes it
        if self.format_gate and raw["format"] == 0.0:
            # SkyRL-SQL checks the format first and returns -1 without executing: a correct query in a broken
            # format earns nothing beyond the penalty.
            raw.update({name: 0.0 for name in REWARD_NAMES if name != "format_penalty"})
        rewards = {name: weight * raw[name] for name, weight in self.weights.items()}
        metrics.update(exec_match=exec_match, format=raw["format"], answered=float(sql is not None))
        return Outcome(observation=message, rewards=rewards, terminated=sql is not None, metrics=metrics)

    def _zero_rewards(self) -> dict[str, float]:
        return dict.fromkeys(self.weights, 0.0)

    def _running_metrics(self) -> dict[str, float]:
        return {"sql_queries": float(self._queries), "query_errors": float(self._errors),
                "timeouts": float(self._timeouts)}  # fmt: skip

    def close(self) -> None:
        self.scorer.close()
        super().close()
