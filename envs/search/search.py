"""Search-augmented question answering (Search-R1 protocol, with R1-Searcher and ReSearch variants)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from rl_llm import checks
from rl_llm.envs.base import Outcome, Task, TextEnv
from rl_llm.envs.knowledge import bundled_kb
from rl_llm.envs.parsing import Block, scan_blocks, truncate_middle
from rl_llm.envs.qa_scoring import answer_in_texts, exact_match, f1_score, normalize_answer
from rl_llm.envs.retrieval import Retriever, load_qa
from rl_llm.envs.retrieval.corpus import QAExample
from rl_llm.envs.retrieval.shared import (
    MAX_QUERY_CHARS,
    made_from_url,
    resolve_retriever,
    retrieve_or_explain,
)
from rl_llm.envs.search.protocols import (
    PER_TURN_REWARDS,
    PROTOCOLS,
    REWARDS,
    SearchProtocol,
    r1_searcher_stage1,
)

# Action blocks looked at per turn: the first is run, the others are only counted.
MAX_BLOCKS_SCANNED = 64


class SearchEnv(TextEnv):
    """
    ## Description
    Question answering with a search engine, following Search-R1: the agent reasons, searches, reads the
    top-k passages and answers. The bundled data set is a generated closed-world knowledge base (made-up
    people, companies, cities and countries) with 1-, 2- and 3-hop questions that need exactly that many
    searches (no later hop's passage is in the top 3 of the question searched verbatim); a user's own JSONL
    corpus and QA file (e.g. Wikipedia with NQ/HotpotQA) can be used instead.

    ## Observation
    On reset, ``Question: ...?`` (the protocol's instructions are the system prompt). After a search, the
    passages in the protocol's result block: ``\\n\\n<information>Doc 1(Title: t) text\\n...</information>\\n\\n``
    for ``search_r1``, ``<|begin_of_documents|>`` for ``r1_searcher``, ``<result>`` for ``research``.
    After an invalid action, Search-R1's corrective message with the specific reason.

    ## Action
    One turn ending in one action: ``<search>query</search>`` (``<|begin_of_query|>..<|end_of_query|>`` for
    ``r1_searcher``) or ``<answer>...</answer>`` (with ``\\boxed{x}`` inside for ``research``). The first
    action of a turn is taken and the turn is cut after it, as Search-R1 does; further actions are ignored
    (the result says how many). An unclosed tag, an empty or over-long query, or no action is invalid.

    ## Rewards
    On the final step, one component named after ``reward``: ``"em"`` (exact match after SQuAD
    normalisation, default), ``"f1"``, ``"em_format"`` (Search-R1 format-aware), ``"r1_searcher_stage1"``,
    ``"r1_searcher_stage2"`` or ``"research"`` (see ``search_protocols``). Earlier steps give 0. The
    R1-Searcher think rule is checked per turn (each turn opens with ``<think>`` and closes it once before
    its action; the prompt says so). ``r1_searcher_stage1`` credits the answer by R1-Searcher's stage-1
    cover-EM, as the paper does: an answer listing every candidate (all 8 countries) covers the gold and
    scores as the oracle does (2.0). ``max_answer_words`` adds stage 2's answer-length rule to stage 1 for
    training stage 1 alone: a longer answer earns the wrong-answer -1 (stage 2 uses 10 words, which 8
    one-word names pass; every bundled answer has at most 2 words, so 3 stops the listing).
    ``info["metrics"]``: ``tool_calls``, ``correct`` (EM), ``f1``, ``answered``, ``turns``,
    ``invalid_actions``, ``retrieval_hit`` (a gold answer appeared in some retrieved passage).

    ## Episode End
    Terminated by an answer; truncated after ``max_turns`` turns (then scored as "no answer").
    ``info["optimal_tool_calls"]`` on reset is the number of needed searches when known.

    ## Arguments
    - ``corpus`` / ``qa``: JSONL paths (default: the bundled knowledge base, ``kb_seed``); ``hops``: keep only
      bundled questions with these hop counts.
    - ``retriever``: ``"bm25"`` (default; index cached under ``cache_dir``), an ``http://`` retriever server
      URL, or a retriever object (e.g. ``DenseRetriever``); ``top_k`` (3).
    - ``protocol``: ``"search_r1"`` (default), ``"r1_searcher"``, ``"research"``; ``reward`` as above.
    - ``max_answer_words`` (None): the stage-1 answer-length rule above (``r1_searcher_stage1`` only).
    - ``max_turns`` (6), ``max_passage_chars`` (4000: the result block is cut in the middle beyond it).

    ## Version History
    - v0.1: R1-Searcher's think rule per turn (and in its prompt); ``max_answer_words``; bundled
      multi-hop questions that a verbatim search shortcuts are redrawn (knowledge base format 3).
    - v0: initial release.
    """

    reset_options = frozenset({"task_index"})

    def __init__(
        self,
        corpus: str | os.PathLike[str] | None = None,
        qa: str | os.PathLike[str] | None = None,
        retriever: Retriever | str = "bm25",
        protocol: str = "search_r1",
        reward: str = "em",
        top_k: int = 3,
        max_turns: int = 6,
        hops: tuple[int, ...] | None = None,
        kb_seed: int = 0,
        cache_dir: str | os.PathLike[str] | None = None,
        max_passage_chars: int = 4000,
        max_answer_words: int | None = None,
        render_mode: str | None = None,
    ) -> None:
        if not isinstance(protocol, str) or protocol not in PROTOCOLS:  # a list was "unhashable type"
            raise ValueError(f"protocol must be one of {sorted(PROTOCOLS)}, got {protocol!r}")
        if not isinstance(reward, str) or reward not in REWARDS:
            raise ValueError(f"reward must be one of {sorted(REWARDS)}, got {reward!r}")
        if max_answer_words is not None and (reward != "r1_searcher_stage1"
                                             or checks.integer("max_answer_words", max_answer_words) < 1):
            raise ValueError("max_answer_words (>= 1) is an option of reward='r1_searcher_stage1' only")
        self.max_answer_words = max_answer_words
        top_k = checks.integer("top_k", top_k, minimum=1)
        max_passage_chars = checks.integer("max_passage_chars", max_passage_chars, minimum=1)
        kb_seed = checks.integer("kb_seed", kb_seed, minimum=0)
        corpus, qa = checks.optional_path("corpus", corpus), checks.optional_path("qa", qa)
        cache_dir = checks.optional_path("cache_dir", cache_dir)
        if (corpus is None) != (qa is None):
            raise ValueError("pass both corpus and qa (your own data) or neither (the bundled knowledge base)")
        super().__init__(max_turns=max_turns, render_mode=render_mode)
        self.protocol: SearchProtocol = PROTOCOLS[protocol]
        self.stop = self.protocol.stop
        self.reward_name, self.top_k, self.max_passage_chars = reward, top_k, max_passage_chars
        tasks = bundled_kb(kb_seed).search_questions if qa is None else load_qa(qa)
        if hops is not None:
            if isinstance(hops, (str, bytes)) or not isinstance(hops, Iterable):  # hops=2 was "not iterable"
                raise ValueError(f"hops must be a list of tool-call counts, such as [1, 2], got {hops!r}")
            hops = tuple(checks.integer(f"hops[{index}]", hop) for index, hop in enumerate(hops))
            tasks = [t for t in tasks if t.optimal_tool_calls in hops]
        if not tasks:
            raise ValueError(f"no questions left (hops={hops})")
        self.tasks: list[QAExample] = tasks
        self.retriever = resolve_retriever(retriever, corpus, kb_seed, cache_dir)
        self._owns_retriever = made_from_url(self.retriever, retriever)

    # -- episode -----------------------------------------------------------------------------------------
    def _reset(self, options: dict[str, Any]) -> Task:
        index = self._choose_task_index(options, len(self.tasks))
        self.current_task = self.tasks[index]
        self.normalized_golds = [normalize_answer(gold) for gold in self.current_task.answers]
        self.tool_calls = self.invalid_actions = 0
        self.response = ""  # the policy's turns and the observations between them (for format rewards)
        self.turn_texts: list[str] = []  # the policy's turns alone (per-turn format rules)
        self.retrieval_hit = False  # a gold answer appeared in a passage retrieved so far
        question = self.current_task.question
        info: dict[str, Any] = {"task_index": index}
        if self.current_task.optimal_tool_calls is not None:
            info["optimal_tool_calls"] = self.current_task.optimal_tool_calls
        observation = f"Question: {question if question.endswith('?') else question + '?'}"
        self.initial_observation = observation
        return Task(observation, self.current_task.id, self.protocol.instructions, info)

    def _step(self, action: str) -> Outcome:
        blocks = scan_blocks(action, self.protocol.markers, limit=MAX_BLOCKS_SCANNED)
        if not blocks or not blocks[0].closed:
            return self._invalid(action, self._reason(blocks))
        first = blocks[0]
        self.response += action[: first.end]
        self.turn_texts.append(action[: first.end])
        if first.name == "answer":
            return self._finish(self.protocol.extract_answer(first.content), finished=True)
        if not first.content:
            return self._invalid("", "the search query is empty", keep_turn=True)
        if len(first.content) > MAX_QUERY_CHARS:
            return self._invalid("", f"the search query is over {MAX_QUERY_CHARS} characters", keep_turn=True)
        return self._search(first.content, ignored=len(blocks) - 1)

    def _reason(self, blocks: list[Block]) -> str:
        if blocks:
            opening, closing = self.protocol.markers[blocks[0].name]
            return f"the {opening} tag was not closed with {closing}"
        return "there was no complete search or answer tag"

    def _search(self, query: str, ignored: int) -> Outcome:
        self.tool_calls += 1
        hits, error = retrieve_or_explain(self.retriever, query, self.top_k)
        if not self.retrieval_hit:
            self.retrieval_hit = answer_in_texts((hit.passage.contents for hit in hits), self.normalized_golds)
        notes = [error] if error else []
        if ignored:
            notes.append(f"only the first action of a turn is run; {ignored} more in that turn were ignored")
        if self.turn == self.max_turns - 1:
            notes.append("this was the last search: give the answer in the next turn")
        observation = self.protocol.observation(hits, "; ".join(notes))
        if len(observation) > self.max_passage_chars:
            observation = _cut_inside(observation, self.protocol.result_tags, self.max_passage_chars)
        return self._continue(observation, invalid=False)

    def _invalid(self, action: str, reason: str, keep_turn: bool = False) -> Outcome:
        """A corrective observation; ``keep_turn`` when the turn's text was already added to the response."""
        self.invalid_actions += 1
        if not keep_turn:
            self.response += action
            self.turn_texts.append(action)
        return self._continue(self.protocol.corrective(reason), invalid=True)

    def _continue(self, observation: str, invalid: bool) -> Outcome:
        if self.turn >= self.max_turns:  # the base class truncates after this step: score it as unanswered
            outcome = self._finish(None, finished=False)
            return Outcome(observation, outcome.rewards, invalid_action=invalid, metrics=outcome.metrics, info=outcome.info)
        self.response += observation
        return Outcome(observation, {self.reward_name: 0.0}, invalid_action=invalid, metrics=self._metrics(None))

    def _finish(self, answer: str | None, finished: bool) -> Outcome:
        golds = self.current_task.answers
        correct = exact_match(answer, golds) if answer is not None else 0.0  # an unfinished episode has no answer
        # The "em" reward is this exact match; the other rewards score the response themselves.
        if self.reward_name == "em":
            reward = correct
        elif self.reward_name == "r1_searcher_stage1":
            reward = r1_searcher_stage1(self.response, answer, golds, turns=self.turn_texts,
                                        max_answer_words=self.max_answer_words)  # fmt: skip
        elif self.reward_name in PER_TURN_REWARDS:
            reward = REWARDS[self.reward_name](self.response, answer, golds, turns=self.turn_texts)
        else:
            reward = REWARDS[self.reward_name](self.response, answer, golds)
        verdict = "correct" if correct else "incorrect"
        message = f"Episode over: the answer is {verdict}." if answer is not None else "Episode over: no answer was given."
        return Outcome(message, {self.reward_name: float(reward)}, terminated=finished,
                       metrics=self._metrics(answer, correct), info={"answer": answer})  # fmt: skip

    def _metrics(self, answer: str | None, correct: float = 0.0) -> dict[str, float]:
        """Running metrics; ``correct`` is the exact match of ``answer`` (0 while there is none)."""
        golds = self.current_task.answers
        return {
            "tool_calls": float(self.tool_calls),
            "correct": correct,
            "f1": f1_score(answer, golds) if answer is not None else 0.0,
            "answered": float(answer is not None),
            "turns": float(self.turn),
            "invalid_actions": float(self.invalid_actions),
            "retrieval_hit": float(self.retrieval_hit),
        }

    def close(self) -> None:
        if self._owns_retriever:
            self.retriever.close()
        super().close()


def _cut_inside(observation: str, tags: tuple[str, str], limit: int) -> str:
    """Shorten the text inside the result block so the tags survive the cut."""
    opening, closing = tags
    start = observation.find(opening) + len(opening)
    end = observation.rfind(closing)
    inner = truncate_middle(observation[start:end], max(limit - (len(observation) - (end - start)), 200))
    return observation[:start] + inner + observation[end:]
