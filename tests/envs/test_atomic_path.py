"""rl_llm.paths.atomic_path: the one "write a temporary file, then rename it" of the environments."""

from __future__ import annotations

import threading

import pytest

from rl_llm.paths import atomic_path


def test_the_file_appears_whole_on_success_and_nothing_is_left_on_failure(tmp_path) -> None:
    target = tmp_path / "sub" / "data.txt"
    with atomic_path(target) as partial:
        assert partial.parent == target.parent and partial.exists() and not target.exists()
        partial.write_text("new")
    assert target.read_text() == "new"
    with pytest.raises(RuntimeError), atomic_path(target) as partial:
        partial.write_text("half")
        raise RuntimeError("writer failed")
    assert target.read_text() == "new"
    assert sorted(p.name for p in target.parent.iterdir()) == ["data.txt"]


def test_concurrent_writers_get_their_own_temporary_files(tmp_path) -> None:
    target = tmp_path / "shared.txt"
    seen: list[str] = []
    barrier = threading.Barrier(8)

    def write(number: int) -> None:
        with atomic_path(target) as partial:
            seen.append(partial.name)
            barrier.wait()  # every writer holds its temporary file at the same time
            partial.write_text(f"writer {number}\n" * 1000)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(seen)) == 8
    text = target.read_text()
    assert text in {f"writer {n}\n" * 1000 for n in range(8)}
    assert [p.name for p in tmp_path.iterdir()] == ["shared.txt"]


def test_the_file_gets_the_mode_a_plain_open_gives(tmp_path) -> None:
    with atomic_path(tmp_path / "atomic.txt") as partial:
        partial.write_text("x")
    (tmp_path / "plain.txt").write_text("x")
    assert (tmp_path / "atomic.txt").stat().st_mode == (tmp_path / "plain.txt").stat().st_mode
