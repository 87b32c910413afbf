"""Questions over a generated knowledge base whose needed look-ups are known.

A k-hop question names one entity and follows k-1 relations before asking a fact of the entity it reaches:
"In what year was the company that Ilo Varn works for founded?" needs a search for Ilo Varn (whose passage
names the company) and one for the company. A question is kept only if no search for an earlier entity of
its chain can reveal a later link or the answer (no passage mentioning an earlier entity contains them), and,
when a retriever is given, only if searching the question text verbatim does not put the passage of a later hop
in the top ``SHORTCUT_TOP_K`` (that search would skip hops), so the oracle's k searches are needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rl_llm.envs.knowledge.generator import RELATIONS, Entity, KnowledgeBase
from rl_llm.envs.qa_scoring import normalize_answer
from rl_llm.envs.retrieval.corpus import QAExample
from rl_llm.envs.tools.calculator import calculate, format_number

FACT_QUESTIONS: dict[tuple[str, str], str] = {
    ("person", "born"): "In what year was {x} born?",
    ("person", "occupation"): "What is the occupation of {x}?",
    ("person", "birthplace"): "In which city was {x} born?",
    ("person", "employer"): "Which company does {x} work for?",
    ("company", "founded"): "In what year was {x} founded?",
    ("company", "industry"): "In which industry does {x} operate?",
    ("company", "employees"): "How many people does {x} employ?",
    ("company", "headquarters"): "In which city does {x} have its headquarters?",
    ("company", "founder"): "Who founded {x}?",
    ("city", "founded"): "In what year was {x} founded?",
    ("city", "population"): "What is the population of {x}?",
    ("city", "country"): "In which country is {x}?",
    ("country", "continent"): "On which continent is {x}?",
    ("country", "capital"): "What is the capital of {x}?",
    ("country", "currency"): "What is the currency of {x}?",
}
RELATION_PHRASES = {
    "birthplace": "the city where {x} was born",
    "employer": "the company that {x} works for",
    "headquarters": "the city where {x} has its headquarters",
    "founder": "the founder of {x}",
    "country": "the country that {x} is in",
    "capital": "the capital of {x}",
}
# Results a verbatim search of the question shows (Search-v0's default top_k): none may be a later hop's passage.
SHORTCUT_TOP_K = 3
_OUT_RELATIONS = {
    kind: [relation for relation, (source, _) in RELATIONS.items() if source == kind]
    for kind in ("person", "company", "city", "country")
}


def fact_answers(kb: KnowledgeBase, entity: Entity, fact: str) -> tuple[str, ...]:
    """Gold answers of a fact: the linked entity's name, or the attribute (numbers also with commas)."""
    if fact in entity.links:
        return (kb.linked(entity, fact).name,)
    value = entity.attrs[fact]
    if isinstance(value, int) and value >= 10_000:
        return (str(value), f"{value:,}")
    return (str(value),)


class _Mentions:
    """Normalised texts of the passages mentioning each entity, to check what a search could reveal."""

    def __init__(self, kb: KnowledgeBase) -> None:
        self.ids = kb.mentioning()
        texts = {entity.id: " " + normalize_answer(kb.passage(entity).contents) + " " for entity in kb.entities.values()}
        self.by_entity = {eid: [texts[p] for p in ids] for eid, ids in self.ids.items()}

    def reveals(self, entity_id: str, facts: Sequence[str]) -> bool:
        needles = [" " + normalize_answer(fact) + " " for fact in facts]
        return any(needle in text for text in self.by_entity[entity_id] for needle in needles)


def chain_is_sequential(mentions: _Mentions, chain: Sequence[Entity], answers: Sequence[str]) -> bool:
    """True when a search for entity j of the chain can find neither the passage of entity j+1 (only its
    name), nor the name of entity j+2.., nor the answer."""
    for j in range(len(chain) - 1):
        if chain[j + 1].id in mentions.ids[chain[j].id]:
            return False
        later = [entity.name for entity in chain[j + 2 :]] + list(answers)
        if mentions.reveals(chain[j].id, later):
            return False
    return True


def skips_hops(retriever: Any, question: str, oracle_queries: Sequence[str], k: int = SHORTCUT_TOP_K) -> bool:
    """True when searching ``question`` verbatim shows the passage of a hop after the first (titled by its
    entity's name, the oracle query of that hop) in the top ``k``: an agent would need fewer searches."""
    shown = {hit.passage.title for hit in retriever.search_batch([question], k)[0]}
    return bool(shown & set(oracle_queries[1:]))


def search_questions(
    kb: KnowledgeBase, per_hops: dict[int, int], seed: int = 0, retriever: Any = None
) -> list[QAExample]:
    """``per_hops[k]`` distinct k-hop questions for each k (1..3), drawn with ``seed``. With a ``retriever``
    over the KB's passages (``search_batch``), multi-hop questions that a verbatim search shortcuts are
    redrawn (see ``skips_hops``)."""
    rng = np.random.default_rng(seed)
    entities = list(kb.entities.values())
    mentions = _Mentions(kb)
    questions: list[QAExample] = []
    for hops, count in sorted(per_hops.items()):
        if not 1 <= hops <= 3:
            raise ValueError(f"hops must be 1, 2 or 3, got {hops}")
        seen: set[str] = set()
        for _attempt in range(count * 200):
            if len(seen) == count:
                break
            example = _draw_question(kb, rng, entities, hops, mentions)
            if example is None or example.question in seen:
                continue
            if hops > 1 and retriever is not None and skips_hops(retriever, example.question, example.oracle_queries):
                continue
            seen.add(example.question)
            questions.append(
                QAExample(f"kb{kb.seed}-h{hops}-{len(seen) - 1}", example.question, example.answers,
                          hops, example.oracle_queries, example.meta)
            )  # fmt: skip
    return questions


def _draw_question(
    kb: KnowledgeBase, rng: np.random.Generator, entities: list[Entity], hops: int, mentions: _Mentions
) -> QAExample | None:
    chain = [entities[int(rng.integers(len(entities)))]]
    relations: list[str] = []
    for _ in range(hops - 1):
        relation = _choice(rng, _OUT_RELATIONS[chain[-1].kind])
        relations.append(relation)
        chain.append(kb.linked(chain[-1], relation))
    if len({entity.id for entity in chain}) < len(chain):
        return None
    last = chain[-1]
    fact = _choice(rng, [f for (kind, f) in FACT_QUESTIONS if kind == last.kind])
    if fact in last.links and kb.linked(last, fact) in chain:
        return None
    answers = fact_answers(kb, last, fact)
    if not chain_is_sequential(mentions, chain, answers):
        return None
    phrase = chain[0].name
    for relation in relations:
        phrase = RELATION_PHRASES[relation].format(x=phrase)
    question = FACT_QUESTIONS[(last.kind, fact)].format(x=phrase)
    meta: dict[str, Any] = {"hops": hops, "relations": relations, "fact": fact, "chain": [e.id for e in chain]}
    return QAExample("", question, answers, hops, tuple(e.name for e in chain), meta)


def _choice(rng: np.random.Generator, options: Sequence[str]) -> str:
    return options[int(rng.integers(len(options)))]


@dataclass(frozen=True)
class OracleCall:
    """One tool call of the reference solution: tool name and JSON arguments."""

    tool: str
    arguments: dict[str, Any] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class ToolTask:
    """A question needing look-ups and/or computation, with the reference calls that answer it."""

    id: str
    question: str
    answers: tuple[str, ...]
    kind: str
    calls: tuple[OracleCall, ...]

    @property
    def optimal_tool_calls(self) -> int:
        return len(self.calls)

    @property
    def tools_needed(self) -> frozenset[str]:
        return frozenset(call.tool for call in self.calls)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "question": self.question, "answers": list(self.answers), "kind": self.kind,
                "calls": [{"tool": c.tool, "arguments": c.arguments} for c in self.calls]}  # fmt: skip

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> ToolTask:
        calls = tuple(OracleCall(c["tool"], dict(c["arguments"])) for c in record["calls"])
        return cls(record["id"], record["question"], tuple(record["answers"]), record["kind"], calls)


def _search(name: str) -> OracleCall:
    return OracleCall("search", {"query": name})


def _calc(expression: str) -> OracleCall:
    return OracleCall("calculator", {"expression": expression})


PRIME_COUNT_CODE = (
    "limit = {n}\nsieve = [True] * limit\nsieve[0:2] = [False, False]\n"
    "for i in range(2, int(limit ** 0.5) + 1):\n    if sieve[i]:\n        sieve[i*i::i] = [False] * len(sieve[i*i::i])\n"
    "print(sum(sieve))"
)


def _count_primes_below(n: int) -> int:
    sieve = np.ones(n, dtype=bool)
    sieve[:2] = False
    for i in range(2, int(n**0.5) + 1):
        if sieve[i]:
            sieve[i * i :: i] = False
    return int(sieve.sum())


_Draft = tuple[str, str, tuple[OracleCall, ...], list[Entity]]
# kind -> (subject kind, relation to the second entity, attribute a of the subject, attribute b of the second
# entity, question, calculator expression over a and b): a search for each entity, then one calculation.
_TWO_LOOKUP_TASKS = {
    "founding_age": ("company", "founder", "founded", "born", "How old was the founder of {s} in the year {s} "
                     "was founded (founding year minus birth year)?", "{a} - {b}"),
    "city_age_at_birth": ("person", "birthplace", "born", "founded", "How many years before the birth of {s} was "
                          "the city where {s} was born founded (birth year minus founding year)?", "{a} - {b}"),
    "employer_gap": ("person", "employer", "born", "founded", "How many years apart are the birth of {s} and the "
                     "founding of the company {s} works for (as a non-negative number)?", "abs({a} - {b})"),
}  # fmt: skip


def _tool_task(kb: KnowledgeBase, rng: np.random.Generator, kind: str) -> _Draft:
    """(question, answer, oracle calls, entities looked up in order) of one task of ``kind``."""
    cities = kb.of_kind("city")
    if kind in _TWO_LOOKUP_TASKS:
        subject_kind, relation, attr_a, attr_b, template, expression = _TWO_LOOKUP_TASKS[kind]
        candidates = kb.of_kind(subject_kind)
        subject = candidates[int(rng.integers(len(candidates)))]
        other = kb.linked(subject, relation)
        formula = expression.format(a=subject.attrs[attr_a], b=other.attrs[attr_b])
        calls = (_search(subject.name), _search(other.name), _calc(formula))
        return template.format(s=subject.name), format_number(calculate(formula)), calls, [subject, other]
    if kind == "arithmetic":
        a, b, c = (int(rng.integers(low, high)) for low, high in ((100, 10_000), (11, 999), (1, 100_000)))
        return f"What is {a} * {b} - {c}?", str(a * b - c), (_calc(f"{a} * {b} - {c}"),), []
    if kind == "digit_sum":
        city = cities[int(rng.integers(len(cities)))]
        population = int(city.attrs["population"])
        code = f"print(sum(int(digit) for digit in str({population})))"
        question = f"What is the sum of the decimal digits of the population of {city.name}?"
        return question, str(sum(int(d) for d in str(population))), (_search(city.name), OracleCall("python", {"code": code})), [city]
    if kind == "prime_count":
        n = int(rng.integers(500, 20_000))
        code = PRIME_COUNT_CODE.format(n=n)
        return f"How many prime numbers are smaller than {n}?", str(_count_primes_below(n)), (OracleCall("python", {"code": code}),), []
    if kind == "lookup":
        city = cities[int(rng.integers(len(cities)))]
        return f"What is the population of {city.name}?", str(city.attrs["population"]), (_search(city.name),), [city]
    raise ValueError(f"unknown tool task kind {kind!r}")


TOOL_TASK_KINDS = ("founding_age", "city_age_at_birth", "employer_gap", "arithmetic", "digit_sum", "prime_count", "lookup")


def tool_tasks(kb: KnowledgeBase, per_kind: int, seed: int = 0) -> list[ToolTask]:
    """``per_kind`` distinct tasks of every kind in ``TOOL_TASK_KINDS``."""
    rng = np.random.default_rng(seed)
    mentions = _Mentions(kb)
    tasks: list[ToolTask] = []
    for kind in TOOL_TASK_KINDS:
        seen: set[str] = set()
        for _attempt in range(per_kind * 50):
            if len(seen) == per_kind:
                break
            question, answer, calls, chain = _tool_task(kb, rng, kind)
            if question not in seen and chain_is_sequential(mentions, chain, ()):
                seen.add(question)
                tasks.append(ToolTask(f"kb{kb.seed}-{kind}-{len(seen) - 1}", question, (answer,), kind, calls))
    return tasks
