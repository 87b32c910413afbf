"""Docker-specific checks. The attack, session and pool suites also run on docker wherever an engine answers;
here are the container settings on a real engine, and the parts that need none: the images, the error when
there is no engine, the scripts the backend runs in containers (run by the host's bash), and the backend
driving the real docker SDK against a stand-in for the engine's HTTP API."""

from __future__ import annotations

import gc
import io
import json
import re
import socket
import struct
import subprocess
import time
import types
import urllib.parse
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from rl_llm.sandboxes import SandboxLimits, SandboxUnavailable, backend_problem, make
from rl_llm.sandboxes.docker_backend import (
    _KILL_SESSION,
    _RUN_WRAPPER,
    BASE_IMAGE_ENV,
    CONTROL_PIDS,
    IMAGES_DIR,
    LABEL,
    DockerSandbox,
    default_base_image,
    dockerfile,
)

from .conftest import TEST_LIMITS, require_backend

try:
    import docker
    import requests
except ImportError:  # the docker extra is not installed: the tests with the engine stand-in skip
    docker = requests = None


def test_images_are_dockerfiles_with_a_local_base_image_argument(monkeypatch):
    path = dockerfile("python")
    assert path.parent == IMAGES_DIR
    monkeypatch.delenv(BASE_IMAGE_ENV, raising=False)
    assert default_base_image(path) == "python:3.11-slim"
    monkeypatch.setenv(BASE_IMAGE_ENV, "rl-llm/debian-python:bookworm")  # e.g. built by sandboxes.rootfs
    assert default_base_image(path) == "rl-llm/debian-python:bookworm"
    text = path.read_text()
    assert "FROM ${BASE_IMAGE}" in text
    assert "apt-get" not in text and "pip install" not in text  # nothing is downloaded
    with pytest.raises(ValueError, match="python"):
        dockerfile("no-such-image")


def test_without_an_engine_make_says_why():
    problem = backend_problem("docker")
    if problem is None:
        pytest.skip("a Docker engine answers here")
    with pytest.raises(SandboxUnavailable, match="docker"):
        make("docker")


def test_container_is_locked_down():
    require_backend("docker")
    with make("docker", **TEST_LIMITS) as sb:
        attrs = sb._container.attrs["HostConfig"]
        assert attrs["NetworkMode"] == "none" and attrs["ReadonlyRootfs"] is True
        assert attrs["PidsLimit"] == TEST_LIMITS["max_processes"] + CONTROL_PIDS
        assert attrs["Memory"] == TEST_LIMITS["memory_mb"] * 1024 * 1024
        assert attrs["CapDrop"] == ["ALL"] and "no-new-privileges" in attrs["SecurityOpt"]
        assert sb.run("touch /etc/x").exit_code != 0
        assert sb.run("echo ok > in-workspace && cat in-workspace").stdout == "ok\n"


# -- the scripts the backend runs inside containers, run here by the host's bash --------------------------------
def run_wrapper(timeout: float, *argv: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["bash", "-c", _RUN_WRAPPER, "rl-sandbox", str(timeout), "/dev/null", *argv],
                          capture_output=True, timeout=30)


def test_run_wrapper_reports_every_timeout_as_124():
    # Sixteen at a time load the machine, so the timer's kill and the command's death race: a timed-out
    # command must still come back as 124, which the host reads as "timed out" (137 would pass as a kill).
    with ThreadPoolExecutor(16) as pool:
        codes = list(pool.map(lambda _: run_wrapper(0.2, "sleep", "5").returncode, range(160)))
    assert codes == [124] * 160
    done = run_wrapper(5, "bash", "-c", "echo out; echo err >&2; sleep 30 & exit 3")
    assert (done.returncode, done.stdout, done.stderr) == (3, b"out\n", b"err\n")  # its own status, at once


def test_kill_session_script_spares_the_shell_unless_told_otherwise(tmp_path: Path):
    pid_file = tmp_path / "shell.pid"
    # a session leader like the driver shell: two jobs, and itself waiting in a builtin (no child of its own)
    shell = subprocess.Popen(["setsid", "bash", "-c", f"sleep 100 & sleep 101 & echo $$ >{pid_file}; read -r x"],
                             stdin=subprocess.PIPE)
    deadline = time.monotonic() + 10
    while not (pid_file.exists() and pid_file.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.01)
    leader = int(pid_file.read_text())

    def session_members() -> set[int]:
        members = set()
        for entry in Path("/proc").iterdir():
            try:
                fields = (entry / "stat").read_text().rsplit(") ", 1)[1].split()
            except (OSError, IndexError):
                continue
            if fields[3] == str(leader) and fields[0] != "Z":
                members.add(int(entry.name))
        return members

    try:
        assert len(session_members()) == 3
        subprocess.run(["bash", "-c", _KILL_SESSION, "rl-sandbox", str(pid_file), "others"], check=True)
        deadline = time.monotonic() + 5
        while session_members() != {leader} and time.monotonic() < deadline:
            time.sleep(0.01)
        assert session_members() == {leader} and shell.poll() is None  # its jobs are gone, the shell lives on
        subprocess.run(["bash", "-c", _KILL_SESSION, "rl-sandbox", str(pid_file), "all"], check=True)
        assert shell.wait(10) == -9
    finally:
        shell.kill()
        shell.wait()


# -- the backend against docker-py itself, with the engine's HTTP API answered here ---------------------------
# No engine runs on most test machines, so these drive the real SDK (docker-py 7) through a stand-in for the
# engine's REST API: a keyword argument the SDK does not take, or a value it cannot encode, fails here, and the
# requests it sends (the container spec, the exec user) are checked against what the backend promises.
def frame(stream: int, data: bytes) -> bytes:
    """One frame of docker's multiplexed stdout/stderr stream."""
    return struct.pack(">BxxxL", stream, len(data)) + data


class _Raw(io.BytesIO):
    """A response body as requests and docker-py read it (`_fp` mimics the urllib3 internals they peek at)."""

    def __init__(self, data: bytes = b"", chunked: bool = False, sock: Any = None) -> None:
        super().__init__(data)
        self._fp = types.SimpleNamespace(chunked=chunked, chunk_left=None, fp=types.SimpleNamespace(raw=sock))


class FakeEngine(requests.adapters.BaseAdapter if requests else object):  # type: ignore[misc]
    """Answers the Docker engine API for one image and its containers and execs, recording every request.
    `exec_output(cmd) -> (frames, exit code)` says what an exec prints."""

    def __init__(self, base_present: bool = True, start_fails: bool = False,
                 exec_output: Callable[[list[str]], tuple[bytes, int]] = lambda cmd: (b"", 0)) -> None:
        super().__init__()
        self.images = {"python:3.11-slim"} if base_present else set()
        self.start_fails = start_fails
        self.exec_output = exec_output
        self.calls: list[tuple[str, str, dict[str, list[str]], Any]] = []
        self.containers: dict[str, dict[str, Any]] = {}
        self.execs: dict[str, dict[str, Any]] = {}
        self.open_streams: list[socket.socket] = []
        self.closed = False

    def client(self) -> Any:
        client = docker.DockerClient(base_url="tcp://127.0.0.1:9", version="1.44")
        client.api.mount("http://", self)
        return client

    def paths(self, method: str) -> list[str]:
        return [path for verb, path, _, _ in self.calls if verb == method]

    def close(self) -> None:
        self.closed = True
        for stream in self.open_streams:
            stream.close()

    def send(self, request: Any, **_: Any) -> requests.Response:
        url = urllib.parse.urlsplit(request.url)
        path = re.sub(r"^/v[\d.]+", "", urllib.parse.unquote(url.path))
        query = urllib.parse.parse_qs(url.query)
        body = json.loads(request.body) if isinstance(request.body, (str, bytes)) and request.body else None
        self.calls.append((request.method, path, query, body))
        status, payload, raw = self.answer(request.method, path, query, body)
        response = requests.Response()
        response.status_code, response.request, response.url = status, request, request.url
        response.reason = {200: "OK", 201: "Created", 204: "No Content", 404: "Not Found"}.get(status, "Error")
        response.headers["Content-Type"] = "application/json"
        response.raw = raw if raw is not None else _Raw(b"" if payload is None else json.dumps(payload).encode())
        return response

    def answer(self, method: str, path: str, query: dict[str, list[str]], body: Any) -> tuple[int, Any, Any]:
        parts = path.strip("/").split("/")
        if parts[0] == "images" and method == "GET":
            name = "/".join(parts[1:-1])
            return (200, {"Id": name}, None) if name in self.images else (404, {"message": f"No such image: {name}"}, None)
        if path == "/build":
            self.images |= {query["t"][0], "0123abcd"}
            stream = json.dumps({"stream": "Step 1/6 : ARG BASE_IMAGE"}) + json.dumps({"stream": "Successfully built 0123abcd"})
            return 200, None, _Raw(stream.encode(), chunked=True)
        if path == "/containers/json":
            return 200, [], None
        if path == "/containers/create":
            cid = f"c{len(self.containers):063d}"
            self.containers[cid] = {"Id": cid, "Config": body, "HostConfig": body["HostConfig"], "Running": False}
            return 201, {"Id": cid, "Warnings": []}, None
        if parts[0] == "containers" and parts[1] in self.containers:
            container = self.containers[parts[1]]
            if method == "DELETE":
                del self.containers[parts[1]]
                return 204, None, None
            if parts[2:] == ["json"]:
                return 200, {"Id": container["Id"], "Config": container["Config"], "HostConfig": container["HostConfig"]}, None
            if parts[2:] == ["start"]:
                return (500, {"message": "cannot start: bad mount"}, None) if self.start_fails else (204, None, None)
            if parts[2:] == ["exec"]:
                eid = f"e{len(self.execs)}"
                self.execs[eid] = {"body": body, "container": parts[1]}
                return 201, {"Id": eid}, None
        if parts[0] == "exec" and parts[1] in self.execs:
            record = self.execs[parts[1]]
            if parts[2:] == ["start"]:
                ours, engine_side = socket.socketpair()
                if record["body"]["AttachStdin"]:  # a shell: it runs (and reads its input) until the end
                    self.open_streams.append(engine_side)
                    record["code"] = None
                    return 101, None, _Raw(sock=socket.SocketIO(ours, "rwb"))
                output, record["code"] = self.exec_output(record["body"]["Cmd"])
                engine_side.sendall(output)
                engine_side.close()  # the exec is over: its stream ends
                return 101, None, _Raw(sock=socket.SocketIO(ours, "rb"))
            if parts[2:] == ["json"]:
                return 200, {"Running": record["code"] is None, "ExitCode": record["code"]}, None
        return 404, {"message": f"the fake engine does not know {method} {path}"}, None


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> FakeEngine:
    pytest.importorskip("docker", reason="the docker extra is not installed: pip install 'rl-llm[docker]'")
    fake = FakeEngine()
    monkeypatch.setattr("rl_llm.sandboxes.docker_backend._swept", True)  # no stale-container sweep
    monkeypatch.delenv(BASE_IMAGE_ENV, raising=False)  # the stand-in holds the Dockerfile's default base
    return fake


def test_container_spec_as_the_sdk_sends_it(engine):
    client = engine.client()
    with DockerSandbox(SandboxLimits(**TEST_LIMITS), client=client, cpus=0.5) as sb:
        (cid, container), = engine.containers.items()
        host, config = container["HostConfig"], container["Config"]
        assert host["NetworkMode"] == "none" and host["ReadonlyRootfs"] is True and host["Init"] is True
        assert host["Memory"] == host["MemorySwap"] == TEST_LIMITS["memory_mb"] * 1024 * 1024  # no swap
        assert host["PidsLimit"] == TEST_LIMITS["max_processes"] + CONTROL_PIDS
        assert host["NanoCpus"] == 500_000_000
        assert host["CapDrop"] == ["ALL"] and host["SecurityOpt"] == ["no-new-privileges"]
        assert host["Tmpfs"]["/tmp"].startswith("rw,nosuid,nodev,size=16m") and host["Tmpfs"]["/dev/pts"].startswith("ro,")
        assert host["ShmSize"] == 16 * 1024 * 1024
        assert sorted(host["Binds"]) == sorted([f"{sb.workdir}:/workspace:rw", f"{sb._workspace.io_dir}:/run/rl-io:ro"])
        assert host["Ulimits"] == [{"Name": "core", "Soft": 0, "Hard": 0}]
        assert config["User"] == "65534:65534" and config["WorkingDir"] == "/workspace"
        assert config["Image"].startswith("rl-llm-sandbox-python:") and config["Cmd"] == ["sleep", "infinity"]
        assert config["Labels"][LABEL] == "container" and "RL_LLM_HOST_ONLY" not in str(config["Env"])
        (build,) = [query for verb, path, query, _ in engine.calls if path == "/build"]
        assert build["pull"] == ["False"] and build["dockerfile"] == ["python.Dockerfile"]
        assert json.loads(build["buildargs"][0]) == {"BASE_IMAGE": "python:3.11-slim"}
        assert engine.paths("POST")[-1] == f"/containers/{cid}/start"
        workdir = sb.workdir
    assert engine.paths("DELETE") == [f"/containers/{cid}"] and engine.containers == {}
    assert not workdir.exists()
    assert not engine.closed  # the caller's client stays open
    client.close()


def test_a_container_that_fails_to_start_is_removed(engine):
    engine.start_fails = True
    with pytest.raises(docker.errors.APIError, match="bad mount"):
        DockerSandbox(SandboxLimits(**TEST_LIMITS), client=engine.client())
    assert len(engine.paths("DELETE")) == 1 and engine.containers == {}  # created, failed, removed


def test_a_missing_base_image_is_reported_and_never_pulled(engine):
    engine.images.clear()
    with pytest.raises(SandboxUnavailable, match=re.escape("`docker pull python:3.11-slim`")):
        DockerSandbox(SandboxLimits(**TEST_LIMITS), client=engine.client())
    assert not [path for _, path, _, _ in engine.calls if path in ("/build", "/images/create", "/containers/create")]


def test_a_client_the_sandbox_made_is_closed_with_it(engine, monkeypatch):
    monkeypatch.setattr("rl_llm.sandboxes.docker_backend.docker_problem", lambda: None)
    monkeypatch.setattr("rl_llm.sandboxes.docker_backend._client", engine.client)
    sb = make("docker", **TEST_LIMITS)
    assert not engine.closed
    sb.close()
    assert engine.closed and engine.containers == {}


def test_run_and_kill_processes_go_through_docker_exec(engine):
    engine.exec_output = lambda cmd: (frame(1, b"out\n") + frame(2, b"err\n") + frame(1, b"more"), 3)
    with DockerSandbox(SandboxLimits(**TEST_LIMITS), client=engine.client()) as sb:
        res = sb.run("echo out; echo err >&2; printf more; exit 3", timeout=5)
        assert (res.stdout, res.stderr, res.exit_code, res.timed_out) == ("out\nmore", "err\n", 3, False)
        sb.kill_processes()
        uid = sb._workspace.uid
    run_exec, kill_exec = (record["body"] for record in engine.execs.values())
    assert run_exec["User"] == kill_exec["User"] == f"{uid}:{uid}"
    assert run_exec["Cmd"][:3] == ["bash", "-c", _RUN_WRAPPER] and run_exec["Cmd"][4] == "5.000"
    assert kill_exec["Cmd"] == ["bash", "-c", "kill -KILL -1"]
    # with no stream attached the engine answers exec start at once, before the kill has run: it must be
    assert kill_exec["AttachStdout"] and kill_exec["AttachStderr"]


def test_a_dropped_sandbox_with_a_spare_shell_is_collected_and_removed(engine):
    sb = DockerSandbox(SandboxLimits(**TEST_LIMITS), client=engine.client(), keep_warm=True)
    sb._res.spare.result(timeout=10)  # the spare shell (a docker exec) is up
    dropped = weakref.ref(sb)
    del sb
    gc.collect()
    assert dropped() is None  # the spare shell does not keep its sandbox alive
    assert engine.containers == {} and len(engine.paths("DELETE")) == 1


def test_a_stream_closed_from_its_own_demux_thread_still_frees_its_socket(engine, monkeypatch):
    # A dropped shell's finalizer runs wherever garbage collection happens, its own demux thread included;
    # here that thread closes the stream on its first frame, as such a finalizer would.
    real_frames_iter, errors, streams = docker.utils.socket.frames_iter, [], []

    def frames_then_close(sock: Any, tty: bool) -> Any:
        for item in real_frames_iter(sock, tty):
            try:
                streams[0].close()
            except Exception as exc:
                errors.append(exc)
            yield item

    monkeypatch.setattr(docker.utils.socket, "frames_iter", frames_then_close)
    with DockerSandbox(SandboxLimits(**TEST_LIMITS), client=engine.client()) as sb:
        streams.append(sb.spawn_shell().stream)
        engine.open_streams[-1].sendall(frame(1, b"ready\n"))
        streams[0]._thread.join(5)
        assert not streams[0]._thread.is_alive() and errors == []
        assert streams[0].raw.fileno() == -1  # the socket is closed, not leaked
