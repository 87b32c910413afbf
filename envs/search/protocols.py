"""The three search-agent protocols of docs/research-protocols.md#search-agents and their rewards.

- ``search_r1``: ``<search>q</search>``, passages in ``<information>``, ``<answer>``; reward exact match, or the
  format-aware table of Search-R1's ``qa_em_format`` (1 / 0.8 / 0.3 / 0.2 / 0.1 / 0).
- ``r1_searcher``: ``<|begin_of_query|>q<|end_of_query|>``, passages in ``<|begin_of_documents|>``; rewards
  stage 1 (cover-EM +-1, +0.5 retrieval format, +0.5 think/answer format) and stage 2 (F1, -2 for any format
  violation). R1-Searcher prefills ``<think>`` after "Assistant:" and the policy writes one ``</think>``;
  a chat model cannot be prefilled, so one leading ``<think>`` written by the policy is taken as that
  prefill. In a multi-turn chat every assistant turn is its own message, so the think rule holds *per
  turn* (each turn: an optional leading ``<think>``, no other ``<think>``, exactly one ``</think>``) and the
  prompt says so; with ``turns=None`` the response is one turn, the paper's single-sequence rule.
  Stage 1 credits the answer by cover-EM, faithfully: an answer that lists every candidate (e.g. all the
  countries) covers the gold and scores as the oracle does. Its ``max_answer_words`` option adds stage 2's
  answer-length rule (a longer answer is not credited; stage 2 uses ``MAX_ANSWER_WORDS``) for stage-1-only
  training.
- ``research``: ``<search>``, passages in ``<result>``, ``<answer>...\\boxed{x}...</answer>``; reward F1 of the
  boxed answer, 0.1 for a well-formed wrong one, 0 for a bad template or no answer.

Every function takes the *response*: the policy's turns (each cut after its first action, as Search-R1 does)
with the environment's observations between them, exactly as the model saw them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rl_llm.envs.parsing import extract_all_tags
from rl_llm.envs.qa_scoring import answer_in_texts, cover_exact_match, exact_match, f1_score, normalize_answer
from rl_llm.envs.retrieval.base import Hit, format_passages


@dataclass(frozen=True)
class SearchProtocol:
    name: str
    search_tags: tuple[str, str]
    result_tags: tuple[str, str]
    instructions: str
    answer_tags: tuple[str, str] = ("<answer>", "</answer>")

    @property
    def markers(self) -> dict[str, tuple[str, str]]:
        return {"search": self.search_tags, "answer": self.answer_tags}

    @property
    def stop(self) -> tuple[str, str]:
        return (self.search_tags[1], self.answer_tags[1])

    def observation(self, hits: Sequence[Hit], note: str = "") -> str:
        """The injected search result; ``note`` (errors, ignored actions) goes inside the result block so the
        format rewards still see a well-formed sequence."""
        if self.name == "r1_searcher":
            docs = "".join(f"({i}){h.passage.title}: {h.passage.text}\n" for i, h in enumerate(hits, 1)) or "None"
        else:
            docs = format_passages(hits) or "No passage matches the query.\n"
        if note:
            docs += f"({note})\n"
        opening, closing = self.result_tags
        if self.name == "r1_searcher":
            return f"\n\n{opening}\n{docs}{closing}\n\n"
        return f"\n\n{opening}{docs}{closing}\n\n"

    def corrective(self, reason: str) -> str:
        """Search-R1's invalid-action message (first person: it continues the model's own text), with why."""
        (s_open, s_close), (a_open, a_close) = self.search_tags, self.answer_tags
        return (f"\nMy previous action is invalid: {reason}. If I want to search, I should put the query between "
                f"{s_open} and {s_close}. If I want to give the final answer, I should put the answer between "
                f"{a_open} and {a_close}. Let me try again.\n")  # fmt: skip

    def extract_answer(self, content: str) -> str | None:
        """The answer inside the answer block (the ``\\boxed{}`` content for ReSearch)."""
        if self.name == "research":
            return last_boxed(content)
        return content.strip()


PROTOCOLS = {
    "search_r1": SearchProtocol(
        "search_r1", ("<search>", "</search>"), ("<information>", "</information>"),
        "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you "
        "get new information. After reasoning, if you find you lack some knowledge, you can call a search engine "
        "by <search> query </search> and it will return the top searched results between <information> and "
        "</information>. You can search as many times as you want. If you find no further external knowledge "
        "needed, you can directly provide the answer inside <answer> and </answer>, without detailed "
        "illustrations. For example, <answer> Beijing </answer>.",
    ),
    "r1_searcher": SearchProtocol(
        "r1_searcher", ("<|begin_of_query|>", "<|end_of_query|>"), ("<|begin_of_documents|>", "<|end_of_documents|>"),
        "The User asks a question, and the Assistant solves it. The Assistant first thinks about the reasoning "
        "process in the mind and then provides the User with the final answer. The reasoning process and final "
        "answer are enclosed within <think> </think> and <answer> </answer> tags, respectively, i.e., "
        "\"<think> reasoning process here </think>\n\n<answer> final answer here </answer>\". During the thinking "
        "process, the Assistant can search for uncertain knowledge with the format "
        "\"<|begin_of_query|> search query (only keywords) here <|end_of_query|>\". A query must involve only a "
        "single triple. Then the system provides the Assistant with helpful information in the format "
        "\"<|begin_of_documents|> ...search results... <|end_of_documents|>\". This is a conversation: each "
        "of your turns is one message. Start every turn with <think>, close it with </think> once, then write "
        "either one search query or the final answer; after the documents arrive, think again in your next turn.",
    ),
    "research": SearchProtocol(
        "research", ("<search>", "</search>"), ("<result>", "</result>"),
        "You are a helpful assistant that can solve the given question step by step with the help of a search "
        "tool. Given a question, you need to first think about the reasoning process in the mind and then provide "
        "the answer. During thinking, you can invoke the search tool to search for fact information about "
        "specific topics if needed. The reasoning process and answer are enclosed within <think> </think> and "
        "<answer> </answer> tags respectively, and the search query and result are enclosed within <search> "
        "</search> and <result> </result> tags respectively. For example, <think> This is the reasoning process. "
        "</think> <search> search query here </search> <result> search result here </result> <think> This is the "
        "reasoning process. </think> <answer> The final answer is \\[ \\boxed{answer here} \\] </answer>. In the "
        "last part of the answer, the final exact answer is enclosed within \\boxed{} with latex format.",
    ),
}  # fmt: skip


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (braces balanced) or ``\\boxed x``, else None."""
    start = text.rfind("\\boxed")
    if start < 0:
        return None
    rest = text[start + len("\\boxed") :]
    if rest.startswith(" "):
        return rest[1:].split("$")[0].strip()
    if not rest.startswith("{"):
        return None
    depth = 0
    for i, char in enumerate(rest):
        depth += char == "{"
        depth -= char == "}"
        if depth == 0:
            return rest[1:i].strip()
    return None


# -- Search-R1 -------------------------------------------------------------------------------------------
_SEARCH_R1_TAGS = tuple(f"<{c}{t}>" for t in ("think", "search", "information", "answer") for c in ("", "/"))
# state -> {tag: next state}: think -> (search -> information -> think)* -> answer
_SEARCH_R1_MACHINE = {
    "start": {"<think>": "in_think"},
    "information": {"<think>": "in_think"},
    "in_think": {"</think>": "after_think"},
    "after_think": {"<search>": "in_search", "<answer>": "in_answer"},
    "in_search": {"</search>": "after_search"},
    "after_search": {"<information>": "in_information"},
    "in_information": {"</information>": "information"},
    "in_answer": {"</answer>": "end"},
}
_INSIDE = {"in_think", "in_search", "in_information", "in_answer"}


def _split_on_tags(text: str, tags: Sequence[str]) -> list[str]:
    """``text`` cut before and after every occurrence of ``tags`` (linear: one pass over the ``<``s)."""
    parts: list[str] = []
    last = position = 0
    while (position := text.find("<", position)) >= 0:
        tag = next((t for t in tags if text.startswith(t, position)), None)
        if tag is None:
            position += 1
            continue
        parts += [text[last:position], tag]
        last = position = position + len(tag)
    parts.append(text[last:])
    return parts


def is_valid_search_r1_sequence(response: str) -> bool:
    """Search-R1's ``is_valid_sequence``: balanced tags, the think/search/information/answer order, and
    nothing but whitespace between blocks."""
    if any(response.count(f"<{t}>") != response.count(f"</{t}>") for t in ("think", "search", "information", "answer")):
        return False
    state = "start"
    for part in _split_on_tags(response, _SEARCH_R1_TAGS):
        if part in _SEARCH_R1_TAGS:
            state = _SEARCH_R1_MACHINE.get(state, {}).get(part, "")
            if not state:
                return False
        elif part.strip() and state not in _INSIDE:
            return False
    return state == "end"


def search_r1_em_format(
    response: str, answer: str | None, golds: Sequence[str], *, structure_format_score: float = 0.2,
    final_format_score: float = 0.1, retrieval_score: float = 0.1, score: float = 1.0,
) -> float:
    """Search-R1 ``qa_em_format.compute_score_em`` with the constants of its training scripts."""
    valid = is_valid_search_r1_sequence(response)
    retrieved = valid and _gold_in_information(response, golds)
    if answer is not None and exact_match(answer, golds):
        return score if valid else score - structure_format_score
    if valid:
        return structure_format_score + (retrieval_score if retrieved else 0.0)
    return final_format_score if answer is not None else 0.0  # fmt: skip


def _gold_in_information(response: str, golds: Sequence[str]) -> bool:
    return answer_in_texts(extract_all_tags(response, "information"), [normalize_answer(gold) for gold in golds])


# -- R1-Searcher -----------------------------------------------------------------------------------------
def _strip_prefilled_think(response: str) -> str:
    stripped = response.lstrip()
    return stripped[len("<think>") :] if stripped.startswith("<think>") else response


def _r1_retrieval_counts(solution: str) -> list[int]:
    return [solution.count(marker) for marker in (
        "<|begin_of_documents|>\n", "<|end_of_documents|>\n\n", "<|begin_of_query|>", "<|end_of_query|>",
        "<|begin_of_documents|>", "<|end_of_documents|>", "<|begin_of_documents|>\n(1)")]  # fmt: skip


# Stage 2's answer-length limit (words), optional in stage 1.
MAX_ANSWER_WORDS = 10


def _thinks_per_turn(turns: Sequence[str]) -> bool:
    """R1-Searcher's think counts (0 ``<think>`` past the prefill, one ``</think>``) in every turn."""
    return all(
        (body := _strip_prefilled_think(turn)).count("<think>") == 0 and body.count("</think>") == 1 for turn in turns
    )


def r1_searcher_stage1(
    response: str, answer: str | None, golds: Sequence[str], *, turns: Sequence[str] | None = None,
    max_answer_words: int | None = None,
) -> float:
    """Stage 1: +1/-1 cover-EM answer, +0.5 balanced retrieval tags with >= 1 retrieval, +0.5 think/answer
    format (per turn when ``turns`` are given). ``max_answer_words``: a longer answer is not credited."""
    solution = _strip_prefilled_think(response)
    covered = answer is not None and "<answer>" in solution and bool(cover_exact_match(answer, golds))
    if covered and max_answer_words is not None and len(str(answer).split()) > max_answer_words:
        covered = False
    reward = 1.0 if covered else -1.0
    counts = _r1_retrieval_counts(solution)
    if len(set(counts)) == 1 and counts[0] >= 1:
        reward += 0.5
    if _thinks_per_turn(turns or [response]) and solution.count("<answer>") == solution.count("</answer>") == 1:
        reward += 0.5
    return reward


def r1_searcher_stage2(
    response: str, answer: str | None, golds: Sequence[str], *, turns: Sequence[str] | None = None
) -> float:
    """Stage 2: answer F1 (0 without an answer), minus 2 for any format violation (think counts per turn
    when ``turns`` are given)."""
    solution = _strip_prefilled_think(response)
    reward = f1_score(answer, golds) if answer is not None and "</answer>" in solution else 0.0
    answer_text = solution.split("<answer>")[-1].split("</answer>")[0].strip()
    documents_removed = _remove_blocks(solution, "<|begin_of_documents|>", "<|end_of_documents|>")
    violation = (
        len(set(_r1_retrieval_counts(solution))) != 1
        or "Assistant" in solution or "assistant" in solution
        or not _thinks_per_turn(turns or [response])
        or solution.count("<answer>") != 1 or solution.count("</answer>") != 1
        or "begin_of_query" in answer_text or "begin_of_documents" in answer_text
        or len(answer_text.split()) > MAX_ANSWER_WORDS
        or any("\u4e00" <= char <= "\u9fff" for char in documents_removed)
    )  # fmt: skip
    return reward - 2.0 if violation else reward


def _remove_blocks(text: str, opening: str, closing: str) -> str:
    kept, position = [], 0
    while (start := text.find(opening, position)) >= 0:
        end = text.find(closing, start + len(opening))
        if end < 0:
            break
        kept.append(text[position:start])
        position = end + len(closing)
    kept.append(text[position:])
    return "".join(kept)


# -- ReSearch --------------------------------------------------------------------------------------------
def is_valid_research_template(response: str) -> bool:
    """ReSearch ``validate_format``: paired think tags (at least one), exactly one answer, every
    ``<search>`` followed by its ``</search>`` and a ``<result>...</result>``, a ``\\boxed{}`` in the answer."""
    if response.count("<think>") != response.count("</think>") or response.count("<think>") == 0:
        return False
    if response.count("<answer>") != 1 or response.count("</answer>") != 1:
        return False
    position = 0
    while (search := response.find("<search>", position)) >= 0:
        search_end = response.find("</search>", search)
        result = response.find("<result>", search)
        result_end = response.find("</result>", result) if result >= 0 else -1
        if -1 in (search_end, result, result_end) or not search < search_end < result < result_end:
            return False
        position = result_end
    start, end = response.find("<answer>"), response.find("</answer>")
    return start < end and "\\boxed{" in response[start:end] and "}" in response[start:end]


def research_reward(response: str, answer: str | None, golds: Sequence[str], *, finished: bool = True) -> float:
    """ReSearch ``compute_score``: 0 for a bad template, an unfinished response or no boxed answer; else the
    answer F1, or 0.1 when it is 0."""
    if not finished or answer is None or not is_valid_research_template(response):
        return 0.0
    f1 = f1_score(answer, golds)
    return f1 if f1 > 0 else 0.1


# Rewards that take the policy's turns (``turns=``): their think rule is per turn in a multi-turn chat.
PER_TURN_REWARDS = frozenset({"r1_searcher_stage1", "r1_searcher_stage2"})
RewardFn = Callable[[str, "str | None", Sequence[str]], float]
REWARDS: dict[str, RewardFn] = {
    "em": lambda response, answer, golds: exact_match(answer, golds) if answer is not None else 0.0,
    "f1": lambda response, answer, golds: f1_score(answer, golds) if answer is not None else 0.0,
    "em_format": search_r1_em_format,
    "r1_searcher_stage1": r1_searcher_stage1,
    "r1_searcher_stage2": r1_searcher_stage2,
    "research": research_reward,
}
