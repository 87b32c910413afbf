"""The Sandbox contract on every available backend: run, argv, stdin, files, limits, make() and errors."""

from __future__ import annotations

import logging

import pytest

from rl_llm.sandboxes import (
    ExecResult,
    SandboxError,
    SandboxLimits,
    SandboxPathError,
    SandboxUnavailable,
    available_backends,
    backend_problem,
    make,
    resolve_backend,
)
from rl_llm.sandboxes.workspace import running_as_root

from .conftest import TEST_LIMITS


def test_run_reports_streams_and_exit_code(sandbox):
    res = sandbox.run("echo out; echo err >&2; exit 3")
    assert (res.stdout, res.stderr, res.exit_code) == ("out\n", "err\n", 3)
    assert not res.timed_out and not res.truncated
    assert res.duration_s > 0 and not res.ok
    assert sandbox.run("true").ok


def test_commands_start_in_the_workspace_as_an_unprivileged_user(sandbox):
    res = sandbox.run('pwd; echo "$HOME"; id -u')
    cwd, home, uid = res.stdout.split()
    assert cwd == home == sandbox.inner_workdir
    assert uid != "0"


def test_argv_list_is_not_interpreted_by_a_shell(sandbox):
    res = sandbox.run(["printf", "%s|", "a b", "$HOME", "; rm -rf /", "`id`"])
    assert res.stdout == "a b|$HOME|; rm -rf /|`id`|"


def test_stdin_text_and_binary(sandbox):
    assert sandbox.run("cat", stdin="line1\nline2").stdout == "line1\nline2"
    data = bytes(range(256)) * 1000
    res = sandbox.run("wc -c", stdin=data)
    assert res.stdout.strip() == str(len(data))


def test_large_stdin_that_is_never_read_does_not_deadlock(sandbox):
    res = sandbox.run("echo ignored", stdin=b"x" * 5_000_000, timeout=10)
    assert res.stdout == "ignored\n" and not res.timed_out


def test_env_is_clean_and_extendable(sandbox, monkeypatch):
    monkeypatch.setenv("RL_LLM_HOST_SECRET", "leak")
    res = sandbox.run('echo "${RL_LLM_HOST_SECRET:-none} $GREETING"', env={"GREETING": "hello"})
    assert res.stdout == "none hello\n"


def test_stdio_can_be_reopened_by_path(sandbox):
    res = sandbox.run("echo to-out > /dev/stdout; echo to-err > /dev/stderr; cat /dev/stdin", stdin="from-in")
    assert (res.stdout, res.stderr) == ("to-out\nfrom-in", "to-err\n")
    assert sandbox.run("cat <(echo process substitution)").stdout == "process substitution\n"


def test_binary_output_is_decoded_without_error(sandbox):
    res = sandbox.run(r"printf 'a\000b\377c'")
    assert res.stdout == "a\x00b\ufffdc"


def test_run_python_small_and_large_snippets(sandbox):
    assert sandbox.run_python("import sys; print(sys.argv, 6 * 7)").stdout == "['-c'] 42\n"
    big = "x = 1\n" * 30_000 + "print('big', x)\n"  # 180 kB: more than one argv string may hold
    res = sandbox.run_python(big)
    assert res.stdout == "big 1\n", res.stderr
    res = sandbox.run_python("raise SystemExit(input() + '!')", stdin="bye\n")
    assert res.exit_code == 1 and res.stderr == "bye!\n"


def test_files_round_trip_and_are_visible_inside(sandbox):
    sandbox.write_file("dir/sub/hello.txt", "hi there")
    sandbox.write_file("bytes.bin", b"\x00\xff")
    assert sandbox.read_file("dir/sub/hello.txt") == b"hi there"
    assert sandbox.read_file("bytes.bin") == b"\x00\xff"
    assert sandbox.run("cat dir/sub/hello.txt && echo more >> dir/sub/hello.txt").ok
    assert sandbox.read_file("dir/sub/hello.txt") == b"hi theremore\n"
    assert (sandbox.workdir / "dir/sub/hello.txt").is_file()
    assert sandbox.read_file("dir/sub/hello.txt", max_bytes=2) == b"hi"


@pytest.mark.parametrize("path", ["/etc/passwd", "../escape", "a/../../b", "", ".", "a/\0b"])
def test_paths_leaving_the_workspace_are_refused(sandbox, path):
    with pytest.raises(SandboxPathError):
        sandbox.write_file(path, "x")
    with pytest.raises(SandboxPathError):
        sandbox.read_file(path)


def test_missing_file_and_non_regular_files(sandbox):
    with pytest.raises(FileNotFoundError):
        sandbox.read_file("nope.txt")
    assert sandbox.run("mkfifo pipe && mkdir adir").ok
    with pytest.raises(SandboxPathError):
        sandbox.read_file("pipe")  # would block forever if opened for reading normally
    with pytest.raises(SandboxPathError):
        sandbox.write_file("adir", "x")


def test_reset_wipes_workspace_and_close_refuses_further_use(backend):
    sb = make(backend, **TEST_LIMITS)
    sb.write_file("a.txt", "1")
    assert sb.run("mkdir -p d/e && touch d/e/f && chmod 000 d").ok
    sb.reset()
    assert sb.run("ls -A").stdout == ""
    workdir = sb.workdir
    sb.close()
    sb.close()  # idempotent
    assert sb.closed and not workdir.exists()
    with pytest.raises(SandboxError, match="closed"):
        sb.run("true")


def test_bad_arguments_get_clear_errors(sandbox):
    with pytest.raises(ValueError, match="NUL"):
        sandbox.run("echo \0")
    with pytest.raises(TypeError):
        sandbox.run(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        sandbox.run([])
    with pytest.raises(ValueError, match="timeout"):
        sandbox.run("true", timeout=0)
    with pytest.raises(TypeError, match="stdin"):
        sandbox.run("cat", stdin=3)  # type: ignore[arg-type]


@pytest.mark.parametrize("timeout", [float("inf"), 1e30, 2_000_000, float("nan"), True])
def test_a_timeout_past_what_clocks_take_is_refused_up_front(sandbox, timeout):
    """inf and 1e30 passed "> 0" and overflowed (OverflowError) inside the wait; refused before anything runs."""
    with pytest.raises(ValueError, match=r"timeout must be a positive number of seconds, at most 1,000,000"):
        sandbox.run("touch ran", timeout=timeout)
    assert not (sandbox.workdir / "ran").exists()
    with pytest.raises(ValueError, match=r"^SandboxLimits.wall_timeout must be a positive number of seconds, at most 1,000,000"):
        SandboxLimits(wall_timeout=2e6)


@pytest.mark.parametrize(("env", "error", "match"), [
    ({"A": 1}, ValueError, r"env\['A'\] must be a str"),
    ({"A=B": "1"}, ValueError, r"'A=B' is not a variable name"),
    ({"": "1"}, ValueError, "is not a variable name"),
    ({"A": "x\0y"}, ValueError, "without NUL"),
    ({"A": "y" * 200_000}, ValueError, "too long"),
    ([("A", "1")], TypeError, "env must be a mapping"),
])  # fmt: skip
def test_bad_extra_environment_gets_a_clear_error(sandbox, env, error, match):
    """Before: a bare TypeError from os ("expected str, bytes or os.PathLike object, not int"), "embedded null
    byte", or "Argument list too long" from exec."""
    with pytest.raises(error, match=match):
        sandbox.run("true", env=env)
    assert sandbox.run("echo $A", env={"A": "fine"}).stdout == "fine\n"


def test_a_command_past_the_kernels_argument_cap_runs_from_a_file(sandbox):
    """Linux caps one argv string at 128 KiB: a 1 MB command line (or an argv list holding a 300 KB word) died
    with OSError "Argument list too long"; now bash reads it from a hand-in file, as sessions do."""
    result = sandbox.run("printf %s " + "x" * 1_000_000 + " | wc -c; echo $A; pwd", env={"A": "seen"})
    assert result.ok, result.stderr
    assert result.stdout.split() == ["1000000", "seen", sandbox.inner_workdir]
    word = "it's \"quoted\" $HOME `x` " + "y" * 150_000  # past the file threshold, under the output cap
    result = sandbox.run(["printf", "%s", word])
    assert result.ok and result.stdout == word  # the same word back: quoted, nothing expanded
    assert sandbox.run("exit 7" + " " * 200_000).exit_code == 7
    timed = sandbox.run("sleep 5 #" + "z" * 200_000, timeout=0.5)
    assert timed.timed_out and timed.exit_code == 124


def test_limits_validation_and_make_errors():
    with pytest.raises(ValueError, match="memory_mb"):
        SandboxLimits(memory_mb=0)
    with pytest.raises(TypeError, match="network"):
        SandboxLimits(network="no")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="unknown sandbox limit"):
        SandboxLimits.from_kwargs(memroy_mb=5)
    with pytest.raises(ValueError, match="unknown sandbox backend"):
        make("chroot")
    with pytest.raises(TypeError, match=r"unknown argument.*not_an_option"):
        make("local", not_an_option=1)
    assert "ulimit -HS" in SandboxLimits().ulimit_command()


@pytest.mark.parametrize("name", ["memory_mb", "max_file_size_mb", "cpu_time", "max_output_bytes"])
def test_a_limit_too_large_for_ulimit_is_refused_not_failing_every_command(name):
    """memory_mb=1e15 was taken, and every command then failed with exit code 125 ("ulimit: limit out of range")."""
    with pytest.raises(ValueError, match=rf"SandboxLimits.{name} must be a positive number up to 2\*\*40"):
        make("local", **{name: 10**15})
    assert SandboxLimits(**{name: 2**40}).ulimit_command().startswith("ulimit -HS")


def test_exec_result_helpers():
    res = ExecResult(stdout="a", stderr="b\n", exit_code=0, timed_out=False, duration_s=0.1)
    assert res.ok and res.output == "a\nb\n" and not res.truncated


def test_auto_picks_the_strongest_isolating_backend_and_says_so(caplog, monkeypatch):
    monkeypatch.delenv("RL_LLM_SANDBOX", raising=False)
    monkeypatch.setattr("rl_llm.sandboxes.factory._announced", set())
    isolating = [name for name in ("docker", "bwrap") if backend_problem(name) is None]
    if not isolating:
        with pytest.raises(SandboxUnavailable, match="backend='local'"):
            resolve_backend("auto")
        return
    with caplog.at_level(logging.INFO, logger="rl_llm.sandboxes"):
        chosen = resolve_backend("auto")
    assert chosen == isolating[0]
    assert f"chose {chosen}" in caplog.text
    assert available_backends()[-1] == "local"


def test_auto_never_falls_back_to_local(monkeypatch):
    monkeypatch.delenv("RL_LLM_SANDBOX", raising=False)
    monkeypatch.setattr("rl_llm.sandboxes.factory.backend_problem",
                        lambda name: None if name == "local" else f"{name} is switched off for this test")
    with pytest.raises(SandboxUnavailable, match="bwrap is switched off"):
        resolve_backend("auto")


def test_auto_passes_docker_over_when_its_image_cannot_be_had(monkeypatch):
    # An engine that answers but has neither the sandbox image nor its base image (and sandboxes never pull):
    # `auto` must not pick docker and then fail; asked for by name (the caller may bring a base_image), it may.
    monkeypatch.delenv("RL_LLM_SANDBOX", raising=False)
    monkeypatch.setattr("rl_llm.sandboxes.docker_backend.docker_problem", lambda: None)
    monkeypatch.setattr("rl_llm.sandboxes.docker_backend.default_image_problem",
                        lambda: "base image 'python:3.11-slim' is not present locally")
    monkeypatch.setattr("rl_llm.sandboxes.factory.ISOLATING", ("docker", "local"))  # local stands in for bwrap
    assert backend_problem("docker") == "base image 'python:3.11-slim' is not present locally"
    assert resolve_backend("auto") == "local"
    assert resolve_backend("docker") == "docker"


def test_env_var_overrides_auto(monkeypatch):
    monkeypatch.setenv("RL_LLM_SANDBOX", "local")
    assert resolve_backend("auto") == "local"


def test_local_backend_warns_that_it_is_unsafe(caplog):
    with caplog.at_level(logging.WARNING, logger="rl_llm.sandboxes"), make("local", **TEST_LIMITS) as sb:
        assert sb.run("echo local").stdout == "local\n"
    assert "UNSAFE" in caplog.text


def test_each_sandbox_gets_its_own_uid_and_workspace():
    if not running_as_root():
        pytest.skip("private uids are only assigned when running as root")
    with make("local", **TEST_LIMITS) as first, make("local", **TEST_LIMITS) as second:
        assert first._workspace.uid != second._workspace.uid
        assert first.workdir != second.workdir
