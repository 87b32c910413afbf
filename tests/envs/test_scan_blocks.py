"""``scan_blocks``: several kinds of action blocks in order, unclosed blocks, limits."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rl_llm.envs.parsing import Block, extract_all_tags, scan_blocks

MARKERS = {"search": ("<search>", "</search>"), "answer": ("<answer>", "</answer>"),
           "query": ("<|begin_of_query|>", "<|end_of_query|>")}  # fmt: skip


def test_blocks_come_in_order_and_bodies_hide_other_tags() -> None:
    text = "x <search> a </search> y <|begin_of_query|>q<|end_of_query|><answer>b <search>no</search></answer>"
    blocks = scan_blocks(text, MARKERS)
    assert [(b.name, b.content) for b in blocks] == [("search", "a"), ("query", "q"), ("answer", "b <search>no</search>")]
    assert text[blocks[0].start : blocks[0].end] == "<search> a </search>"


def test_an_unclosed_block_ends_the_scan() -> None:
    blocks = scan_blocks("<search>a</search><answer>never closed <search>b</search>", MARKERS)
    assert blocks[-1] == Block("answer", "never closed <search>b</search>", 18, 57, closed=False)
    assert len(blocks) == 2 and scan_blocks("", MARKERS) == []


def test_limit_bounds_the_number_of_blocks() -> None:
    assert len(scan_blocks("<search>x</search>" * 100, MARKERS, limit=5)) == 5


@given(st.lists(st.sampled_from(["<search>", "</search>", "<answer>", "</answer>", "a", " ", "<", ">"]), max_size=40))
def test_single_kind_agrees_with_extract_all_tags(parts) -> None:
    text = "".join(parts)
    only_search = {"search": MARKERS["search"]}
    closed = [b.content for b in scan_blocks(text, only_search) if b.closed]
    assert closed == extract_all_tags(text, "search")
