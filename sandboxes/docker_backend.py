"""The Docker backend: one container per sandbox, from an image built out of `sandboxes/images/`.

The container has no network (`network_mode="none"`), a read-only root, memory/pids/CPU limits, all
capabilities dropped, no-new-privileges and no pseudo-terminals; its only writable places are the workspace
(bind-mounted from the host at /workspace), /tmp and /dev/shm (size-capped tmpfs). Its main process sleeps
as `nobody`; commands run through `docker exec` as the slot's uid, so `kill -1` from that uid
(`kill_processes`, `reset`) ends them all and nothing else.
Images are built from the Dockerfiles here on first use and cached by content hash; the base image must
already be present locally: nothing is pulled from a registry at run time.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import secrets
import socket
import threading
import time
from pathlib import Path
from typing import Any

from rl_llm.sandboxes.base import (
    INNER_IO_DIR,
    INNER_WORKDIR,
    TIMEOUT_EXIT_CODE,
    Command,
    ExecResult,
    Sandbox,
    SandboxError,
    SandboxLimits,
    SandboxUnavailable,
    sandbox_env,
)
from rl_llm.sandboxes.oneshot import DRAIN_GRACE_S
from rl_llm.sandboxes.processes import close_fds
from rl_llm.sandboxes.shell import DRIVER_ARGV, ShellProcess, driver_setup
from rl_llm.sandboxes.streams import FdPump, StreamCapture
from rl_llm.sandboxes.workspace import Workspace, log

IMAGES_DIR = Path(__file__).parent / "images"
LABEL = "rl-llm.sandbox"
_swept = False
# Runs one command as its own process group with a timer; when it returns, its background jobs go too.
# Arguments: timeout, stdin ("-": the exec's own, which the host streams; else a file), argv. bash's own
# "Killed" notices go to /dev/null, the command keeps stderr. Whether the timer fired is its exit status: once
# its sleep is over it ignores SIGTERM and exits with the status of its kill, so stopping it cannot be mistaken
# for it having fired (or the other way round).
_RUN_WRAPPER = r"""exec 3>&2 2>/dev/null
[ "$2" = - ] || exec <"$2"
set -m
"${@:3}" <&0 2>&3 3>&- &
job=$!
{ sleep "$1"; trap '' TERM; kill -KILL -- "-$job"; } </dev/null >/dev/null 3>&- &
timer=$!
set +m
wait "$job"
code=$?
kill -TERM -- "-$timer"
wait "$timer" && code=124
kill -KILL -- "-$job"
exit "$code"
"""
# SIGKILL the processes of a shell's session (the shell's pid, from file $1, is its id), without the shell
# itself unless $2 is "all". Read from /proc: slim images have no pkill.
_KILL_SESSION = r"""read -r shell <"$1" || exit 0
for stat in /proc/[0-9]*/stat; do
  { read -r line <"$stat"; } 2>/dev/null || continue
  fields=(${line##*) })
  pid=${stat//[^0-9]/}
  if [[ ${fields[3]} == "$shell" && ($pid != "$shell" || $2 == all) ]]; then kill -KILL "$pid"; fi
done 2>/dev/null
exit 0
"""
# Mounted over /dev/pts in place of the engine's devpts: no pseudo-terminals in the sandbox, as with bwrap.
_NO_PTYS = "ro,nosuid,nodev,noexec,size=4k,mode=0555"
# Where the driver shells note their pids: a tmpfs of its own, so the sandbox's /tmp lists only what the
# programs in it wrote (as with bwrap, where the host holds that state).
CONTROL_DIR = "/run/rl-ctl"
_CONTROL_TMPFS = "rw,nosuid,nodev,noexec,size=64k,mode=1777"
# The engine keeps an exec's streams open up to 2 s after its process exited (for output still in flight,
# e.g. held by a detached child); past that, plus start-up slack, the in-container timer has failed.
_HOST_GRACE_S = 5.0
# Container-wide process cap on top of the sandbox user's own limit (RLIMIT_NPROC = max_processes): room for
# the container's init and sleep and for the execs that interrupt and kill the user's processes, which must
# still start when a fork bomb has used up the user's share.
CONTROL_PIDS = 8


def _client(timeout: float = 10) -> Any:
    import docker

    return docker.from_env(timeout=timeout)


@functools.cache
def docker_problem() -> str | None:
    """Why docker sandboxes cannot run here, or None if an engine answered a ping."""
    try:
        import docker  # noqa: F401
    except ImportError:
        return "the `docker` Python package is not installed (pip install 'rl-llm[docker]')"
    try:
        client = _client(timeout=3)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:  # the SDK raises many kinds; all mean "no usable engine"
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"no Docker engine answers ({first_line[:200]})"
    return None


def dockerfile(name: str) -> Path:
    path = IMAGES_DIR / f"{name}.Dockerfile"
    if not path.is_file():
        known = sorted(p.name.removesuffix(".Dockerfile") for p in IMAGES_DIR.glob("*.Dockerfile"))
        raise ValueError(f"no sandbox image {name!r}; images in {IMAGES_DIR}: {known}")
    return path


BASE_IMAGE_ENV = "RL_LLM_DOCKER_BASE_IMAGE"  # overrides every Dockerfile's default base image


def default_base_image(path: Path) -> str:
    """``$RL_LLM_DOCKER_BASE_IMAGE``, else the Dockerfile's ``ARG BASE_IMAGE=`` default."""
    if os.environ.get(BASE_IMAGE_ENV):
        return os.environ[BASE_IMAGE_ENV]
    for line in path.read_text().splitlines():
        if line.strip().startswith("ARG BASE_IMAGE="):
            return line.split("=", 1)[1].strip()
    raise ValueError(f"{path} has no `ARG BASE_IMAGE=` line")


def image_tag(path: Path, base: str) -> str:
    """The tag of the image built from Dockerfile `path` on `base` (by content, so edits make a new one)."""
    digest = hashlib.sha256(path.read_bytes() + base.encode()).hexdigest()[:12]
    return f"rl-llm-sandbox-{path.name.removesuffix('.Dockerfile')}:{digest}"


def _present(client: Any, image: str) -> bool:
    import docker

    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        return False
    return True


def _no_base(base: str, path: Path) -> str:
    return (f"base image {base!r} for {path.name} is not present locally; run `docker pull {base}` once, or "
            f"build one from Debian packages (`python -m rl_llm.sandboxes.rootfs`) and set {BASE_IMAGE_ENV} "
            "(sandboxes never pull at run time)")


@functools.cache
def default_image_problem() -> str | None:
    """Why a docker sandbox with the default image cannot start here without a pull, or None (the image, or
    the base image to build it from, is present). `backend="auto"` then passes docker over."""
    path = dockerfile("python")
    base = default_base_image(path)
    try:
        client = _client(timeout=3)
        try:
            if _present(client, image_tag(path, base)) or _present(client, base):
                return None
        finally:
            client.close()
    except Exception as exc:  # the SDK raises many kinds; all mean "no usable image"
        return f"the Docker engine could not list images ({str(exc)[:200]})"
    return _no_base(base, path)


def ensure_image(client: Any, name: str = "python", base_image: str | None = None) -> str:
    """The tag of the image built from images/NAME.Dockerfile, building it once if it is not there yet."""
    import docker

    path = dockerfile(name)
    base = base_image or default_base_image(path)
    tag = image_tag(path, base)
    if _present(client, tag):
        return tag
    if not _present(client, base):
        raise SandboxUnavailable(_no_base(base, path))
    log.info("building sandbox image %s from %s", tag, path)
    try:
        # Builds run only our own Dockerfiles; the host network lets terminal.Dockerfile's apt-get reach the
        # mirror on engines started without a bridge. Sandboxes themselves always run with network "none".
        client.images.build(path=str(IMAGES_DIR), dockerfile=path.name, tag=tag, pull=False, rm=True,
                            buildargs={"BASE_IMAGE": base}, labels={LABEL: "image"}, network_mode="host")
    except (docker.errors.BuildError, docker.errors.APIError) as exc:
        raise SandboxUnavailable(f"building {tag} from {path} failed: {exc}") from None
    return tag


def remove_stale_containers(client: Any) -> int:
    """Remove sandbox containers of processes on this host that no longer exist (crashed owners)."""
    removed = 0
    host = socket.gethostname()
    for container in client.containers.list(all=True, filters={"label": LABEL}):
        owner_host, _, pid = container.labels.get(f"{LABEL}.owner", "").rpartition(":")
        if owner_host == host and pid.isdigit() and not _pid_alive(int(pid)):
            with contextlib.suppress(Exception):
                container.remove(force=True)
                removed += 1
    return removed


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class _ExecStream:
    """A `docker exec` attached over its hijacked socket; a thread splits the multiplexed frames into two
    pipes so the same select loop as for local processes can read them."""

    def __init__(self, api: Any, container_id: str, argv: list[str], *, user: str, env: dict[str, str],
                 stdin: bool) -> None:
        self.api = api
        self.exec_id = api.exec_create(container_id, argv, stdin=stdin, stdout=True, stderr=True, tty=False,
                                       user=user, environment=env, workdir=INNER_WORKDIR)["Id"]
        self.sock = api.exec_start(self.exec_id, socket=True)
        self.raw = getattr(self.sock, "_sock", self.sock)
        self.raw.settimeout(None)  # the client's request timeout must not end an idle session
        self._closed = False
        self.out_read, out_write = os.pipe()
        self.err_read, err_write = os.pipe()
        self._thread = threading.Thread(target=self._demux, args=(out_write, err_write), daemon=True,
                                        name="rl-llm-docker-demux")
        self._thread.start()
        self._feeder: threading.Thread | None = None

    def feed_stdin(self, data: bytes) -> None:
        """Write ``data`` to the process's stdin over the exec's socket, then end it (half-close: EOF there), on
        a thread of its own, so a command that does not read its stdin cannot stall the reading of its output.
        Streamed, not handed in as a file: a file in the io directory stayed readable by every program of the
        sandbox while the command ran, so a program the task checker runs could read the checker itself (its
        expected values, the key of its verdict) off it (docs/design.md#sandboxes)."""

        def feed() -> None:
            with contextlib.suppress(OSError):  # the stream was closed first: nobody reads it any more
                self.raw.sendall(data)
                self.raw.shutdown(socket.SHUT_WR)

        self._feeder = threading.Thread(target=feed, daemon=True, name="rl-llm-docker-stdin")
        self._feeder.start()

    def _demux(self, out_write: int, err_write: int) -> None:
        from docker.utils.socket import STDERR, frames_iter

        try:
            for stream, data in frames_iter(self.sock, tty=False):
                os.write(err_write if stream == STDERR else out_write, data)
        except (OSError, ValueError):  # the socket or our pipes were closed: the exec is over for us
            pass
        finally:
            close_fds(out_write, err_write)

    def send(self, data: bytes) -> None:
        self.raw.sendall(data)

    def exit_code(self, wait: float = 0.0) -> int | None:
        """The exec's exit code, polling up to `wait` seconds while the engine still reports it running."""
        deadline = time.monotonic() + wait
        while True:
            info = self.api.exec_inspect(self.exec_id)
            if not info.get("Running"):
                return info.get("ExitCode")
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.02)

    def close(self) -> None:
        if self._closed:  # closing fd numbers twice could close someone else's new fds
            return
        self._closed = True
        with contextlib.suppress(OSError):
            self.raw.shutdown(socket.SHUT_RDWR)  # the demux thread sees the stream end, a blocked feeder EPIPE
        close_fds(self.out_read, self.err_read)  # and gets EPIPE if it was blocked writing to them
        if self._thread is not threading.current_thread():  # a dropped shell's finalizer may run in its own
            self._thread.join(5)  # demux thread (GC happens anywhere); it then ends on the closed socket
        if self._feeder is not None:
            self._feeder.join(5)  # before the socket's fd is freed for reuse
        for sock in (self.sock, self.raw):  # the SDK's file wrapper, then the socket (frees the fd now)
            with contextlib.suppress(OSError):
                sock.close()


class DockerShell(ShellProcess):
    """The driver shell as a `docker exec` (its status line follows the stdout marker). It holds what runs
    programs in the container, not the sandbox, so a spare shell does not keep a dropped sandbox alive."""

    def __init__(self, user: _ContainerUser, setup: bytes) -> None:
        self._as_user = user
        self._pid_file = f"{CONTROL_DIR}/shell-{secrets.token_hex(8)}"
        argv = ["setsid", "-w", *DRIVER_ARGV]  # own process group, so signals reach only this shell's work
        self.stream = user.exec_stream(argv, stdin=True)
        self.stdin_fd = self.stream.raw.fileno()
        self.stdout_fd, self.stderr_fd, self.status_fd = self.stream.out_read, self.stream.err_read, None
        self._ended = False
        self.stream.send(f"echo $$ >{self._pid_file}\n".encode() + setup)

    def interrupt(self, hard: bool) -> None:
        # Not waited for: the session resynchronises with the shell afterwards anyway.
        if hard:  # SIGKILL to everything in the shell's session but the shell, which keeps its state
            argv = ["bash", "-c", _KILL_SESSION, "rl-sandbox", self._pid_file, "others"]
        else:  # without job control the shell's commands share its group; background jobs ignore SIGINT
            argv = ["bash", "-c", f'kill -INT -- -"$(cat {self._pid_file})"']
        self._as_user.exec_quiet(argv, wait=False)

    def terminate(self) -> None:
        if not self._ended:
            self._ended = True
            with contextlib.suppress(Exception):
                self._as_user.exec_quiet(["bash", "-c", _KILL_SESSION, "rl-sandbox", self._pid_file, "all"])

    def close_pipes(self) -> None:
        self.stream.close()

    def exit_code(self, wait: float = 0.0) -> int | None:
        try:
            code = self.stream.exit_code(wait)
        except Exception:  # the engine lost the exec: treat the shell as gone
            return 255
        return None if code is None else int(code)


class _ContainerUser:
    """Running programs in a sandbox container as the sandbox user (for the sandbox and its shells)."""

    def __init__(self, client: Any, container: Any, user: str, env: dict[str, str]) -> None:
        self.client, self.container, self.user, self.env = client, container, user, env

    def exec_stream(self, argv: list[str], stdin: bool = False, env: dict[str, str] | None = None) -> _ExecStream:
        return _ExecStream(self.client.api, self.container.id, argv, user=self.user,
                           env={**self.env, **(env or {})}, stdin=stdin)

    def exec_quiet(self, argv: list[str], wait: bool = True) -> None:
        """Run `argv`, discarding its output; with `wait`, until it has finished. (Waiting needs its output
        attached: with no stream the engine answers once the process has started, not ended.) Not waiting
        spares the caller the engine's queue of exits, which another exec's held-open output can stall."""
        self.container.exec_run(argv, user=self.user, stdout=wait, stderr=wait)


class DockerSandbox(Sandbox):
    """A container per sandbox; see the module docstring. `image` names a Dockerfile in sandboxes/images/.
    A `client` given by the caller stays open at `close()`; one made here is closed with the sandbox."""

    backend = "docker"
    inner_workdir = INNER_WORKDIR

    def __init__(self, limits: SandboxLimits, *, image: str = "python", base_image: str | None = None,
                 cpus: float = 1.0, env: dict[str, str] | None = None, keep_warm: bool = False,
                 client: Any = None) -> None:
        problem = None if client is not None else docker_problem()
        if problem is not None:
            raise SandboxUnavailable(problem)
        owned = client is None
        client = client or _client()
        try:
            global _swept
            if not _swept:
                _swept = True
                with contextlib.suppress(Exception):
                    remove_stale_containers(client)
            tag = ensure_image(client, image, base_image)
            super().__init__(limits, Workspace(), keep_warm)
        except BaseException:
            if owned:
                client.close()
            raise
        if owned:
            self._res.extra_cleanup.append(client.close)
        ws = self._workspace
        env = sandbox_env(INNER_WORKDIR, env)
        from docker.types import Ulimit

        tmpfs_opts = f"rw,nosuid,nodev,size={int(limits.tmp_size_mb)}m,mode=1777"
        try:
            # create, then start: a container that fails to start is removed here, not left behind
            self._container = container = client.containers.create(
                tag, ["sleep", "infinity"], init=True, user="65534:65534", hostname="sandbox",
                network_mode="bridge" if limits.network else "none", read_only=True,
                mem_limit=f"{int(limits.memory_mb)}m", memswap_limit=f"{int(limits.memory_mb)}m",
                pids_limit=int(limits.max_processes) + CONTROL_PIDS, nano_cpus=int(cpus * 1e9),
                tmpfs={"/tmp": tmpfs_opts, "/dev/pts": _NO_PTYS, CONTROL_DIR: _CONTROL_TMPFS},
                shm_size=f"{int(limits.tmp_size_mb)}m",
                volumes={str(ws.path): {"bind": INNER_WORKDIR, "mode": "rw"},
                         str(ws.io_dir): {"bind": INNER_IO_DIR, "mode": "ro"}},
                working_dir=INNER_WORKDIR, environment=env, cap_drop=["ALL"],
                security_opt=["no-new-privileges"], ulimits=[Ulimit(name="core", soft=0, hard=0)],
                labels={LABEL: "container", f"{LABEL}.owner": f"{socket.gethostname()}:{os.getpid()}"})
            self._res.extra_cleanup.insert(0, functools.partial(_remove, container))  # before the client closes
            container.start()
        except BaseException:
            self.close()  # removes what was created, closes the client, frees the workspace
            raise
        self._as_user = _ContainerUser(client, container, f"{ws.uid}:{ws.gid}", env)
        if keep_warm:
            self._start_warm()

    def _run(self, cmd: Command, timeout: float, stdin: bytes | None, env: dict[str, str]) -> ExecResult:
        started = time.monotonic()
        feed = "/dev/null" if stdin is None else "-"
        argv = ["bash", "-c", _RUN_WRAPPER, "rl-sandbox", f"{timeout:.3f}", feed, *self._shell_argv(cmd)]
        stream = self._as_user.exec_stream(argv, stdin=stdin is not None, env=env)
        if stdin is not None:
            stream.feed_stdin(stdin)
        cap = self.limits.max_output_bytes
        out, err = StreamCapture(cap), StreamCapture(cap)
        pump = FdPump()
        pump.add(stream.out_read, out.on_read)
        pump.add(stream.err_read, err.on_read)
        try:
            if not pump.run(lambda: not pump.reading, started + timeout + _HOST_GRACE_S):
                self._kill_all()  # the in-container timer failed; end every process of the sandbox
                self._res.drop_spare()  # that included the spare shell
                pump.run(lambda: not pump.reading, time.monotonic() + DRAIN_GRACE_S)
            code = stream.exit_code(wait=2.0)  # the engine may report the exec as running a moment longer
        finally:
            pump.close()
            stream.close()
        duration = time.monotonic() - started
        timed_out = code is None or (code == TIMEOUT_EXIT_CODE and duration >= timeout)
        return ExecResult(stdout=out.text(), stderr=err.text(),
                          exit_code=TIMEOUT_EXIT_CODE if timed_out else int(code or 0), timed_out=timed_out,
                          duration_s=duration, truncated=out.truncated or err.truncated)

    def spawn_shell(self) -> ShellProcess:
        return DockerShell(self._as_user, driver_setup(self.limits, INNER_WORKDIR, None))

    def _wipe_private_dirs(self) -> None:
        # As the sandbox user (everything there is its own); chmod first so locked directories go too.
        script = "chmod -R u+rwx /tmp /dev/shm 2>/dev/null; find /tmp /dev/shm -mindepth 1 -delete 2>/dev/null"
        try:
            self._as_user.exec_quiet(["bash", "-c", script])
        except Exception as exc:
            raise SandboxError(f"could not wipe /tmp of container {self._container.short_id}: {exc}") from exc

    def _kill_all(self) -> bool:
        try:
            self._as_user.exec_quiet(["bash", "-c", "kill -KILL -1"])
        except Exception as exc:
            container = self._container.short_id
            raise SandboxError(f"could not kill the processes of container {container}: {exc}") from exc
        return True


def _remove(container: Any) -> None:
    with contextlib.suppress(Exception):
        container.remove(force=True)
