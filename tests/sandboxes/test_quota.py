"""The workspace quota (`SandboxLimits.workspace_size_mb`): a command, a session command or a background job
that writes past it is stopped with a clear message, the workspace stays bounded, the agent can delete files
and go on, and the next episode starts clean. Real sandboxes on the isolating backends, no mocks."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rl_llm.sandboxes import Sandbox, SandboxLimits, make

from .conftest import TEST_LIMITS

MIB = 1024 * 1024
QUOTA_EXIT_CODE = 153  # the documented code (128 + SIGXFSZ), pinned here rather than imported
QUOTA_MB = 8
# A writer of 4 MB files, 50 of them (200 MB) at about 15 a second: minutes of disk filling if left alone.
WRITER = "for i in $(seq 1 50); do head -c 4M /dev/zero > {name}$i || exit 9; sleep 0.05; done"
# What may land between two measurements (one every quota.POLL_S = 0.2 s) on a loaded machine, and more.
BOUND = QUOTA_MB * MIB + 8 * 4 * MIB


@pytest.fixture
def sb(isolating_backend: str) -> Iterator[Sandbox]:
    with make(isolating_backend, **TEST_LIMITS, workspace_size_mb=QUOTA_MB) as sandbox:
        yield sandbox


def used(sandbox: Sandbox) -> int:
    """The workspace's size as the host sees it, counted independently of the sandbox's own walk."""
    total = 0
    for folder, dirs, files in os.walk(sandbox.workdir):
        for name in dirs + files:
            info = os.lstat(os.path.join(folder, name))
            total += max(info.st_size, info.st_blocks * 512)
    return total


def settled_size(sandbox: Sandbox, wait: float = 0.5) -> int:
    """The workspace's size once it has stopped changing (so no writer is left)."""
    before = used(sandbox)
    time.sleep(wait)
    after = used(sandbox)
    assert after == before, f"the workspace is still growing: {before} -> {after} bytes"
    return after


def test_a_command_writing_past_the_quota_is_stopped_with_a_clear_message(sb: Sandbox) -> None:
    res = sb.run(WRITER.format(name="f") + "; echo finished", timeout=10)
    assert res.over_quota and res.exit_code == QUOTA_EXIT_CODE and not res.ok and not res.timed_out
    assert "finished" not in res.stdout
    assert "the workspace passed its size quota: it takes" in res.stderr and f"of {QUOTA_MB} MB" in res.stderr
    assert res.stderr.rstrip().endswith("a command that makes it grow is stopped again")
    assert res.duration_s < 2.0  # the writer alone runs for 2.5 s or more
    assert settled_size(sb) <= BOUND and not (sb.workdir / "f50").exists()


def test_a_session_command_is_stopped_and_the_session_goes_on_in_a_fresh_shell(sb: Sandbox) -> None:
    with sb.session() as sh:
        assert sh.run("mkdir sub && cd sub && export MARK=1").ok
        res = sh.run(WRITER.format(name="../s") + "; echo finished", timeout=10)
        assert res.over_quota and res.exit_code == QUOTA_EXIT_CODE and "finished" not in res.stdout
        assert "passed its size quota" in res.stderr and res.duration_s < 2.0
        assert "the next command starts a fresh shell" in res.stderr  # its shell was killed under it
        assert settled_size(sb) <= BOUND
        res = sh.run('pwd; echo "[$MARK]"')
        assert res.ok and res.stdout == "/workspace\n[]\n" and "still over its size quota" in res.stderr


@pytest.mark.parametrize("launch", ["{writer} &", "setsid nohup bash -c '{writer}' >/dev/null 2>&1 &"],
                         ids=["job", "setsid-nohup"])
def test_a_background_writer_is_stopped_between_commands(sb: Sandbox, launch: str) -> None:
    with sb.session() as sh:
        res = sh.run("cd /tmp; " + launch.format(writer=f"cd /workspace; {WRITER.format(name='bg')}"))
        assert res.ok and not res.over_quota and res.stderr == ""
        time.sleep(1.5)  # no command runs: only the watcher can stop it
        assert settled_size(sb) <= BOUND and not (sb.workdir / "bg50").exists()
        res = sh.run("pwd")
        assert res.ok and res.stdout == "/workspace\n"  # a fresh shell: the old one (in /tmp) was killed
        assert "while no command was running (a background job kept writing), the workspace passed" in res.stderr


def test_the_agent_can_delete_files_and_go_on(sb: Sandbox) -> None:
    assert sb.run("for i in 1 2 3; do head -c 4M /dev/zero > f$i; done").over_quota
    res = sb.run("ls")
    assert res.ok and res.stdout == "f1\nf2\nf3\n" and "still over its size quota" in res.stderr  # no growth
    res = sb.run("head -c 1M /dev/zero > more")
    assert res.over_quota and res.exit_code == QUOTA_EXIT_CODE  # growing while over the quota is not allowed
    res = sb.run("rm f1 f2 more && head -c 2M /dev/zero > new && echo ok")
    assert res.ok and res.stdout == "ok\n" and res.stderr == ""


def test_the_next_episode_is_clean_and_works(sb: Sandbox) -> None:
    assert sb.run(WRITER.format(name="f")).over_quota
    assert sb.run("rm f*").ok
    with sb.session() as sh:
        sh.run(WRITER.format(name="bg") + " &")
        time.sleep(1.5)  # stopped by the watcher; its note waits for a command that never comes
        assert settled_size(sb) <= BOUND
    sb.reset()
    assert list(sb.workdir.iterdir()) == []
    res = sb.run("head -c 6M /dev/zero > a && ls")
    assert res.ok and res.stdout == "a\n" and res.stderr == "" and not res.over_quota
    with sb.session() as sh:
        res = sh.run("head -c 1M /dev/zero > b && ls")
        assert res.ok and res.stdout == "a\nb\n" and res.stderr == ""


def test_a_workload_under_the_quota_is_untouched(sb: Sandbox) -> None:
    res = sb.run("head -c 3M /dev/zero > a && head -c 3M /dev/zero > b && sleep 0.7 && echo done")
    assert res.ok and res.stdout == "done\n" and res.stderr == "" and not res.over_quota
    with sb.session() as sh:
        assert sh.run("mkdir -p sub && cd sub && export MARK=1; (sleep 0.7; echo x > late) &").ok
        time.sleep(1.0)  # the watcher measures while the job lives, and lets it be
        res = sh.run('pwd; echo "[$MARK]"; cat late')
        assert res.stdout == "/workspace/sub\n[1]\nx\n" and res.stderr == "" and not res.over_quota
    assert sorted(path.name for path in sb.workdir.iterdir()) == ["a", "b", "sub"]


def test_files_in_locked_directories_and_hard_links_count_once(sb: Sandbox) -> None:
    # A directory made unreadable (``chmod 000``) still holds its files; a host that is not root must count
    # them all the same, and put the mode back. Hard links are one file.
    res = sb.run("mkdir -p d/e && head -c 3M /dev/zero > d/e/a && for i in 1 2 3 4; do ln d/e/a d/e/l$i; done && "
                 "head -c 3M /dev/zero > d/e/b && chmod 000 d/e && chmod 300 d && echo ok")
    assert res.ok and not res.over_quota, res  # 6 MB: hard links counted once
    res = sb.run("chmod 700 d d/e && head -c 3M /dev/zero > d/e/c && chmod 000 d/e d")
    assert res.over_quota  # 9 MB, all of it in a locked directory
    assert sb.run("stat -c %a d; chmod 700 d; stat -c %a d/e").stdout == "0\n0\n"


def test_too_many_entries_or_too_deep_a_tree_count_as_over_the_quota(sb: Sandbox,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from rl_llm.sandboxes import quota

    monkeypatch.setattr(quota, "MAX_ENTRIES", 300)
    monkeypatch.setattr(quota, "MAX_DEPTH", 20)
    res = sb.run("mkdir many && cd many && touch $(seq 1 400)")
    assert res.over_quota and "holds more than 300 files and directories" in res.stderr
    # Until they are gone every command is stopped at the next measurement (a slow `rm` too), so the
    # dependable way back is the reset.
    sb.reset()
    res = sb.run("mkdir -p $(printf 'x/%.0s' {1..30})")
    assert res.over_quota and "nests directories more than 20 levels deep" in res.stderr
    sb.reset()
    assert sb.run("mkdir -p $(printf 'y/%.0s' {1..20}) && echo ok").stdout == "ok\n"


@pytest.mark.parametrize("bad", [0, -1, True, "512", float("nan"), float("inf")])
def test_bad_quota_values_are_refused(bad: object) -> None:
    with pytest.raises(ValueError, match=r"SandboxLimits.workspace_size_mb must be a positive number up to 2\*\*40"):
        SandboxLimits(workspace_size_mb=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="workspace_size_mb"):
        make("local", workspace_size_mb=bad)
    assert SandboxLimits().workspace_size_mb == 512
    from rl_llm.sandboxes import QUOTA_EXIT_CODE as exported

    assert exported == QUOTA_EXIT_CODE


def test_the_workspace_walk_never_follows_symlinks(tmp_path: Path) -> None:
    from rl_llm.sandboxes.quota import measure

    (tmp_path / "big").write_bytes(b"x" * MIB)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "out").symlink_to(tmp_path)
    (workspace / "file").symlink_to(tmp_path / "big")
    usage = measure(workspace)
    assert usage.entries == 2 and usage.bytes < 64 * 1024 and usage.problem is None
