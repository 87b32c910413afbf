"""Citations of the design docs stay valid: every ``docs/<page>.md#anchor`` cited in the code, configs and
docs names a page and a heading that exist, no file cites a document outside the repository, and repository
paths under ``rl_llm/`` exist (``envs/``, ``agents/``, ``trainers/``, ``sandboxes/`` and ``integrations/`` live at the top
level and install as ``rl_llm.envs`` etc.; see docs/design.md#layout)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCE_DIRS = ("rl_llm", "envs", "agents", "trainers", "sandboxes", "integrations", "tests", "benchmarks", "configs", "docs")
SUFFIXES = {".py", ".md", ".yaml", ".yml"}
# A citation: "docs/<page>.md" not inside another path (generated task files such as "src/docs/x.md" or a
# quoted "docs/guide.md" of a terminal task are not citations).
CITATION = re.compile(r"(?<![\w/\"'])docs/([\w-]+\.md)((?:#[\w-]+)?)")
# A bare "#anchor" right after a docs citation, e.g. "docs/research-protocols.md: OTC in #otc-tool-call-efficiency".
FOLLOWING_ANCHOR = re.compile(r"(?<![\w/])#([a-z0-9]+(?:-[a-z0-9]+)+)\b")
REPO_PATH = re.compile(r"\brl_llm/[\w./*<>-]+")


def source_files() -> list[Path]:
    files = [ROOT / "README.md"]
    for folder in SOURCE_DIRS:
        files += [p for p in (ROOT / folder).rglob("*") if p.suffix in SUFFIXES and p.is_file()]
    return sorted(set(files))


def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(line.lstrip("#")) for line in page.read_text(encoding="utf-8").splitlines() if line.startswith("#")}


def test_the_docs_exist() -> None:
    for page in ("design.md", "research-protocols.md", "writing-an-environment.md", "reproducibility.md"):
        assert (ROOT / "docs" / page).is_file(), page


def test_every_docs_citation_names_a_page_and_heading_that_exist() -> None:
    pages = {page.name: anchors(page) for page in (ROOT / "docs").glob("*.md")}
    broken = []
    for path in source_files():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for match in CITATION.finditer(line):
                page, anchor = match.group(1), match.group(2).lstrip("#")
                if page not in pages or (anchor and anchor not in pages[page]):
                    broken.append(f"{path.relative_to(ROOT)}:{number}: docs/{page}#{anchor}")
                rest = line[match.end() :]
                for extra in FOLLOWING_ANCHOR.findall(rest) if page in pages else []:
                    if extra not in pages[page]:
                        broken.append(f"{path.relative_to(ROOT)}:{number}: docs/{page}#{extra}")
    assert not broken, "citations of missing docs pages or headings:\n" + "\n".join(broken)


def test_links_between_the_docs_resolve() -> None:
    broken = []
    for page in (ROOT / "docs").glob("*.md"):
        for target, anchor in re.findall(r"\]\(([\w./-]*\.md)?(?:#([\w-]+))?\)", page.read_text(encoding="utf-8")):
            linked = (page.parent / target) if target else page
            if not linked.is_file() or (anchor and anchor not in anchors(linked)):
                broken.append(f"{page.name}: ({target}#{anchor})")
    assert not broken, "\n".join(broken)


@pytest.mark.parametrize("outside", ["DESIGN.md", "research protocols", "specs/research-protocols"])
def test_no_file_cites_a_document_outside_the_repository(outside: str) -> None:
    this = Path(__file__).resolve()
    citing = [
        str(path.relative_to(ROOT))
        for path in source_files()
        if path != this and path.suffix != ".md" and outside in path.read_text(encoding="utf-8")
    ]
    assert not citing, f"cite docs/ instead of {outside!r}: {citing}"


def test_repository_paths_under_rl_llm_exist() -> None:
    missing = []
    for path in source_files():
        if path.resolve() == Path(__file__).resolve():
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for cited in REPO_PATH.findall(line):
                cited = cited.rstrip(".,:;)")
                if not any(ROOT.glob(re.sub(r"<[^>]*>", "*", cited))):
                    missing.append(f"{path.relative_to(ROOT)}:{number}: {cited}")
    assert not missing, "paths that do not exist (the subpackages live at the top level):\n" + "\n".join(missing)
