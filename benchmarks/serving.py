"""Serving at scale: rl-llm's env servers under many concurrent clients, against a bare app on the same stack.

Every server runs in its own process (uvicorn, the same settings: uvloop/httptools where installed, or the stack
``--loop``/``--http`` name, no access log, no WebSocket compression unless ``--ws-compression``); the load client
is this process (aiohttp), on the same cores. The first line names the stack. Each client plays whole
MultiArmedBandit-v0 episodes (``horizon`` pulls): reset, then steps until the episode ends, for ``--seconds``
per point. A call is one reset or one step. The baseline, measured in the same run, is a bare FastAPI app
with the same three routes (create, reset, step) and no env: the web stack's own ceiling here.

Printed per point: calls/s, p50 and p99 latency, and the ratios ``ours / bare`` (targets: calls/s >= 0.8x,
p99 <= 2x; docs/serving.md#targets). Also: the WebSocket endpoint ``/sessions/ws`` (one connection per
client, whole episodes over it) against a bare WebSocket route; the same servers with the env replayed from a
recording (``http-replay``, ``ws-replay``: the server's own cost, without the env's); the OpenEnv server over
plain HTTP and ``/ws`` (openenv-core's own client) against the bare app's OpenEnv routes driven by the same
client, and replayed (``openenv-*-replay``); OpenEnv's ``/ws`` with WebSocket compression against without
(``compression``); both servers on uvloop and httptools against asyncio's loop and h11 (``stack``); each
server's own cost per plain-HTTP call with its app called in-process as ASGI, with its fast routes and without
(``asgi``); the server's RSS per open session; the
retriever server's queries/s. The sandbox parts: whole Terminal-v0 episodes played by the oracle with N in flight
(``terminal``: reset, step and check latency, episodes/s, where step p50 doubles against one episode alone,
and a burst of resets against a low start cap) and bare sandbox shells (``sandboxes``).

    python benchmarks/serving.py [--seconds 4] [--rounds 2] [--clients 1 64 256 1000] [--only http http-replay ws ws-replay
        openenv-http openenv-ws openenv-http-replay openenv-ws-replay compression stack asgi memory retriever]
        [--ws-compression] [--loop auto|asyncio|uvloop] [--http auto|h11|httptools]
    python benchmarks/serving.py --only terminal [--terminal-episodes 1 4 16 64] [--terminal-burst 64]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, WebSocket, WebSocketDisconnect
from pydantic import BaseModel, ConfigDict

ENV_ID = "rl-llm/MultiArmedBandit-v0"
HORIZON = 10
ACTION = "<action>A</action>"
HERE = os.path.abspath(__file__)


# -- the bare baseline app (run in a child process with --serve bare) ----------------------------------------
class Create(BaseModel):
    env_id: str
    kwargs: dict[str, Any] = {}
    count: int = 1


class Reset(BaseModel):
    seed: int | None = None
    options: dict[str, Any] | None = None


class Step(BaseModel):
    action: str


def recorded_episode() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The env server's own replies for one episode (reset, then ``HORIZON`` steps), recorded once at start,
    so the bare app answers with the same bytes (the client parses as much) without running an env."""
    from rl_llm.integrations.http_server import CreateRequest, EnvServer, ResetRequest, StepRequest

    async def record() -> tuple[dict[str, Any], list[dict[str, Any]]]:
        server = EnvServer()
        sid = (await server.create(CreateRequest(env_id=ENV_ID, kwargs={"horizon": HORIZON})))[0]
        reset = await server.reset(sid, ResetRequest(seed=0))
        steps = [await server.step(sid, StepRequest(action=ACTION)) for _ in range(HORIZON)]
        server.shutdown()
        return reset, steps

    return asyncio.run(record())


class OpenEnvReset(BaseModel):
    model_config = ConfigDict(extra="allow")  # as OpenEnv's own request models
    seed: int | None = None
    episode_id: str | None = None


class OpenEnvStep(BaseModel):
    model_config = ConfigDict(extra="allow")
    action: dict[str, Any]
    episode_id: str | None = None


def recorded_openenv_episode() -> tuple[list[Any], list[Any]]:
    """The OpenEnv server's own replies for one episode (reset, then ``HORIZON`` steps): the plain-HTTP bodies
    and the ``/ws`` messages, recorded once at start so the bare app's OpenEnv routes answer the same bytes."""
    from fastapi.testclient import TestClient

    from rl_llm.integrations.openenv import create_openenv_app

    with TestClient(create_openenv_app(ENV_ID, {"horizon": HORIZON})) as client:
        http = [client.post("/reset", json={"seed": 0, "episode_id": "e"}).json()]
        http += [client.post("/step", json={"action": {"message": ACTION}, "episode_id": "e"}).json()
                 for _ in range(HORIZON)]  # fmt: skip
        with client.websocket_connect("/ws") as socket:
            ws = []
            for message in [{"type": "reset", "data": {"seed": 0}}] + [{"type": "step", "data": {"message": ACTION}}] * HORIZON:
                socket.send_text(json.dumps(message))
                ws.append(json.loads(socket.receive_text()))
    return http, ws


def bare_app() -> Any:
    """Three routes with the same request bodies as the env server's, answering a recorded episode of
    ``HORIZON`` steps with the server's own replies; FastAPI encodes the returned dicts as an app would. And
    OpenEnv's ``/reset``, ``/step`` and ``/ws``, answering the OpenEnv server's recorded replies: the ceiling
    for the OpenEnv rows, driven by the same clients (openenv-core's own over ``/ws``)."""
    import uuid

    app = FastAPI()
    turns: dict[str, int] = {}
    reset_recorded, steps_recorded = recorded_episode()
    openenv_http, openenv_ws = recorded_openenv_episode()

    def openenv_reply(recorded: list[Any], key: str, reset: bool) -> Any:
        turn = 0 if reset else turns.get(key, 0) + 1
        turns[key] = turn
        return recorded[min(turn, HORIZON)]

    @app.post("/reset")
    async def openenv_reset(request: OpenEnvReset) -> dict[str, Any]:
        return openenv_reply(openenv_http, str(request.episode_id), reset=True)

    @app.post("/step")
    async def openenv_step(request: OpenEnvStep) -> dict[str, Any]:
        return openenv_reply(openenv_http, str(request.episode_id), reset=False)

    async def session(socket: WebSocket, answer: Callable[[dict[str, Any], str], Any]) -> None:
        """Each JSON message answered by ``answer(message, session key)`` until it returns None or the
        client goes."""
        await socket.accept()
        key = uuid.uuid4().hex
        try:
            while (reply := answer(json.loads(await socket.receive_text()), key)) is not None:
                await socket.send_text(json.dumps(reply))
        except WebSocketDisconnect:
            pass
        turns.pop(key, None)

    @app.websocket("/ws")
    async def openenv_session(socket: WebSocket) -> None:
        await session(socket, lambda message, key: None if message.get("type") == "close" else
                      openenv_reply(openenv_ws, key, message.get("type") == "reset"))  # fmt: skip

    def reset_reply(sid: str) -> dict[str, Any]:
        turns[sid] = 0
        return {**reset_recorded, "session_id": sid}

    def step_reply(sid: str) -> dict[str, Any]:
        turn = turns.get(sid, 0)
        turns[sid] = turn + 1
        return {**steps_recorded[min(turn, HORIZON - 1)], "session_id": sid}

    @app.post("/sessions")
    async def create(request: Create) -> dict[str, Any]:
        return {"session_ids": [uuid.uuid4().hex for _ in range(request.count)]}

    @app.post("/sessions/{sid}/reset")
    async def reset(sid: str, request: Reset) -> dict[str, Any]:
        return reset_reply(sid)

    @app.post("/sessions/{sid}/step")
    async def step(sid: str, request: Step) -> dict[str, Any]:
        return step_reply(sid)

    def rl_llm_reply(message: dict[str, Any], sid: str) -> dict[str, Any]:
        op = message["op"]
        return {"session_id": sid} if op == "create" else reset_reply(sid) if op == "reset" else step_reply(sid)

    @app.websocket("/sessions/ws")
    async def ws(socket: WebSocket) -> None:
        await session(socket, rl_llm_reply)

    return app


class ReplayedEnv:
    """Answers ``reset`` and ``step`` with one recorded episode's env outputs, at no env cost: the env server
    serving it (``--serve replay``, the ``ws-replay`` rows) measures the endpoint's own cost per call, so a gap
    to the bare app splits into the server's share and the env's (docs/serving.md#websocket-sessions)."""

    def __init__(self, reset: Any, steps: list[Any]) -> None:
        self._reset, self._steps, self._turn = reset, steps, 0

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        self._turn = 0
        return self._reset

    def step(self, action: str) -> Any:
        self._turn += 1
        return self._steps[min(self._turn, HORIZON) - 1]

    def close(self) -> None:
        pass


def replayed_env() -> Callable[..., ReplayedEnv]:
    """A factory of ``ReplayedEnv``: one episode of the env's own outputs (reset, then ``HORIZON`` steps),
    recorded once here, whatever arguments a server builds its envs with."""
    from rl_llm.integrations.generic import EnvFactory

    env = EnvFactory(ENV_ID, horizon=HORIZON)()
    reset = env.reset(seed=0)
    steps = [env.step(ACTION) for _ in range(HORIZON)]
    return lambda *args, **kwargs: ReplayedEnv(reset, steps)


def replay_server() -> Any:
    from rl_llm.integrations.http_server import EnvServer, ServerConfig

    config = ServerConfig(allowed_env_ids=frozenset({ENV_ID}), max_sessions=12000)
    return EnvServer(config, make_env=replayed_env()).app


def serve_openenv_replay(port: int, flags: list[str]) -> None:
    """The OpenEnv server exactly as ``python -m rl_llm.integrations.openenv`` runs it, each session's env
    replaying one recorded episode (the ``openenv-*-replay`` rows): openenv-core's and the adapter's own
    cost per call, without the env's."""
    import rl_llm.integrations.openenv as openenv

    openenv.make_env = replayed_env()  # in this process only: a benchmark's
    openenv.main(["--env", ENV_ID, "-k", f"horizon={HORIZON}", "--port", str(port), "--max-sessions", "1100",
                  "--max-episodes", "1100", *flags])  # fmt: skip


def stack_flags(args: argparse.Namespace) -> list[str]:
    """The event loop and HTTP parser every server of this run gets."""
    return ["--loop", args.loop, "--http", args.http]


def web_flags(args: argparse.Namespace) -> list[str]:
    """The web-server flags every server of this run gets (the servers' own ``add_web_server_flags``)."""
    return [*(["--ws-compression"] if args.ws_compression else []), *stack_flags(args)]


def serve(kind: str, port: int, flags: list[str]) -> None:
    """One server of the benchmark; every one with the same web-server settings as the servers' own ``main``
    (no access log; WebSocket compression only with ``--ws-compression``; the loop and HTTP parser named)."""
    from rl_llm.integrations.http_server import add_web_server_flags, run_web_server

    if kind == "openenv-replay":
        serve_openenv_replay(port, flags)
    elif kind in ("bare", "replay"):
        app = bare_app() if kind == "bare" else replay_server()
        parser = argparse.ArgumentParser()
        add_web_server_flags(parser)
        args = parser.parse_args(flags)
        args.host, args.port = "127.0.0.1", port
        run_web_server(app, args, log_level="warning")  # the servers' own start, frozen heap included
    else:
        from rl_llm.integrations.http_server import main

        main(["--port", str(port), "--env", ENV_ID, "--max-sessions", "12000", *flags])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def server_process(argv: list[str], url_path: str = "/docs") -> Any:
    """Start a server in a child process and wait until it answers."""
    import httpx

    port = free_port()
    # Servers' own logs go to a file: openenv-core logs a traceback for every client that closes its /ws.
    log = open(f"/tmp/rl-llm-serving-{port}.log", "wb")  # noqa: SIM115 (closed with the process)
    process = subprocess.Popen([sys.executable, *[a.replace("{port}", str(port)) for a in argv]], stderr=log)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(url + url_path, timeout=1)
                break
            except httpx.HTTPError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"error: server {argv} did not start") from None
                time.sleep(0.1)
        yield url, process.pid
    finally:
        process.terminate()
        process.wait(10)
        log.close()


# -- the load ------------------------------------------------------------------------------------------------
@dataclass
class Point:
    calls: int
    seconds: float
    latencies: list[float]
    errors: int
    server_cpu_s: float = 0.0  # CPU the server process used meanwhile (user + system)
    client_cpu_s: float = 0.0  # CPU the load client (this process, one core at most) used meanwhile

    def add(self, other: Point) -> None:
        self.calls += other.calls
        self.seconds += other.seconds
        self.latencies += other.latencies
        self.errors += other.errors
        self.server_cpu_s += other.server_cpu_s
        self.client_cpu_s += other.client_cpu_s

    @property
    def cpu_us(self) -> float:
        """Server CPU per call: unlike calls/s, barely moved by other load on a shared machine."""
        return self.server_cpu_s / max(1, self.calls) * 1e6

    @property
    def client_cpu_us(self) -> float:
        """Client CPU per call. Server and client are one process each, so each can use one core at most: the
        side with the larger CPU per call bounds calls/s (``bound`` in the tables)."""
        return self.client_cpu_s / max(1, self.calls) * 1e6

    @property
    def bound(self) -> str:
        return "server" if self.cpu_us >= self.client_cpu_us else "client"

    @property
    def rate(self) -> float:
        return self.calls / self.seconds

    def pct(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000 if ordered else float("nan")


async def run_load(clients: int, seconds: float, episode: Callable[[Any, Callable[[float], None]], Awaitable[None]],
                   setup: Callable[[Any], Awaitable[Any]], pid: int | None = None) -> Point:
    """``clients`` coroutines each play ``episode`` until ``seconds`` have passed; latencies of each call, and
    the CPU the server (``pid``) and this client used over those seconds only (connecting the clients and
    saying goodbye are left out: with 1,000 clients they are not small)."""
    import aiohttp

    latencies: list[float] = []
    errors = 0
    connector = aiohttp.TCPConnector(limit=clients + 8)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as http:
        states = await asyncio.gather(*(setup(http) for _ in range(clients)))
        # The client's own full collections stopped every client at once for 130-150 ms (aiohttp and
        # openenv-core make a large heap), a stall charged to whichever server was measured then: frozen
        # for the timed seconds, as the servers freeze theirs (http_server.run_web_server).
        gc.collect()
        gc.freeze()
        start, server_before, client_before = time.perf_counter(), cpu_s(pid) if pid else 0.0, time.process_time()
        stop = start + seconds

        def record(latency: float) -> None:
            latencies.append(latency)

        async def client(state: Any) -> None:
            nonlocal errors
            while time.perf_counter() < stop:
                try:
                    await episode(state, record)
                except (aiohttp.ClientError, RuntimeError, asyncio.TimeoutError):
                    errors += 1

        try:
            await asyncio.gather(*(client(state) for state in states))
        finally:  # a point that fails (a server gone) must not leave the rest of the run's heap frozen
            gc.unfreeze()
        elapsed = time.perf_counter() - start
        server_cpu, client_cpu = (cpu_s(pid) if pid else 0.0) - server_before, time.process_time() - client_before
        for state in states:  # a clean goodbye, so servers do not log dropped connections
            if hasattr(state, "close"):
                await state.close()
    return Point(len(latencies), elapsed, latencies, errors, server_cpu, client_cpu)


def http_episode(url: str) -> tuple[Any, Any]:
    async def setup(http: Any) -> tuple[Any, str]:
        async with http.post(url + "/sessions", json={"env_id": ENV_ID, "kwargs": {"horizon": HORIZON}}) as r:
            body = await r.json()
            if r.status != 200:
                raise SystemExit(f"error: creating a session failed: {r.status} {body}")
            return http, body["session_ids"][0]

    async def episode(state: tuple[Any, str], record: Callable[[float], None]) -> None:
        http, sid = state
        t = time.perf_counter()
        async with http.post(f"{url}/sessions/{sid}/reset", json={"seed": 0}) as r:
            await r.read()
            if r.status != 200:
                raise RuntimeError(r.status)
        record(time.perf_counter() - t)
        done = False
        while not done:
            t = time.perf_counter()
            async with http.post(f"{url}/sessions/{sid}/step", json={"action": ACTION}) as r:
                body = await r.json()
                if r.status != 200:
                    raise RuntimeError(r.status)
            record(time.perf_counter() - t)
            done = body["done"]

    return setup, episode


def ws_episode(url: str) -> tuple[Any, Any]:
    ws_url = url.replace("http://", "ws://") + "/sessions/ws"

    async def setup(http: Any) -> Any:
        socket = await http.ws_connect(ws_url, max_msg_size=0)
        await socket.send_str(json.dumps({"op": "create", "env_id": ENV_ID, "kwargs": {"horizon": HORIZON}}))
        await socket.receive_str()
        return socket

    async def episode(socket: Any, record: Callable[[float], None]) -> None:
        t = time.perf_counter()
        await socket.send_str(json.dumps({"op": "reset", "seed": 0}))
        reply = json.loads(await socket.receive_str())
        record(time.perf_counter() - t)
        done = False
        while not done:
            t = time.perf_counter()
            await socket.send_str(json.dumps({"op": "step", "action": ACTION}))
            reply = json.loads(await socket.receive_str())
            record(time.perf_counter() - t)
            if "error" in reply:
                raise RuntimeError(reply["error"])
            done = reply["done"]

    return setup, episode


def openenv_http_episode(url: str) -> tuple[Any, Any]:
    """OpenEnv's plain HTTP: ``/reset`` and ``/step`` carrying the client's own ``episode_id``."""
    import uuid

    async def setup(http: Any) -> tuple[Any, str]:
        return http, uuid.uuid4().hex

    async def episode(state: tuple[Any, str], record: Callable[[float], None]) -> None:
        http, eid = state
        body, done = {"seed": 0, "episode_id": eid}, False
        path = "/reset"
        while not done:
            t = time.perf_counter()
            async with http.post(url + path, json=body) as r:
                reply = await r.json()
                if r.status != 200:
                    raise RuntimeError(r.status)
            record(time.perf_counter() - t)
            done = path == "/step" and reply["done"]
            path, body = "/step", {"action": {"message": ACTION}, "episode_id": eid}

    return setup, episode


def openenv_ws_episode(url: str) -> tuple[Any, Any]:
    """openenv-core's own client (``GenericEnvClient``, its ``/ws`` session)."""
    from openenv.core import GenericEnvClient

    async def setup(http: Any) -> Any:
        client = GenericEnvClient(base_url=url)
        await client.connect()
        return client

    async def episode(client: Any, record: Callable[[float], None]) -> None:
        t = time.perf_counter()
        await client.reset(seed=0)
        record(time.perf_counter() - t)
        done = False
        while not done:
            t = time.perf_counter()
            done = (await client.step({"message": ACTION})).done
            record(time.perf_counter() - t)

    return setup, episode


# The per-call parts, in the order they run: each is measured against the bare app (bench_http).
EPISODES = {"http": http_episode, "http-replay": http_episode, "ws": ws_episode, "ws-replay": ws_episode,
            "openenv-http": openenv_http_episode, "openenv-ws": openenv_ws_episode,
            "openenv-http-replay": openenv_http_episode, "openenv-ws-replay": openenv_ws_episode}  # fmt: skip


WARM_UP_S = 0.3


def measure(url: str, clients: int, seconds: float, proto: str = "http", pid: int | None = None) -> Point:
    """One point, after ``WARM_UP_S`` of one client playing episodes untimed. A server proves each kind of env
    call cheap on its worker pool before running it inline (docs/serving.md#inline-calls): hit cold by 1,000
    clients at once, it answered their first 1,800 calls from the pool, about half a second of queueing that
    was most of the point's p99, paid once per server start (docs/serving.md#measurements)."""
    setup, episode = EPISODES[proto](url)
    asyncio.run(run_load(1, WARM_UP_S, episode, setup))
    return asyncio.run(run_load(clients, seconds, episode, setup, pid))


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    """A process's resident memory now (``VmRSS``) or at its peak (``VmHWM``), in MB."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


# -- report --------------------------------------------------------------------------------------------------
def row(label: str, clients: int, ours: Point, bare: Point) -> str:
    return (
        f"| {label} | {clients} | {bare.rate:,.0f} | {ours.rate:,.0f} | {ours.rate / bare.rate:.2f}x | "
        f"{bare.pct(0.99):.0f} | {ours.pct(0.99):.0f} | {ours.pct(0.99) / bare.pct(0.99):.2f}x | "
        f"{bare.cpu_us:.0f} / {ours.cpu_us:.0f} | {bare.client_cpu_us:.0f} / {ours.client_cpu_us:.0f} | "
        f"{bare.bound} / {ours.bound} | {ours.errors} |"
    )


HEADER = (
    "| endpoint | clients | bare calls/s | ours calls/s | ratio | bare p99 ms | ours p99 ms | p99 ratio | "
    "server CPU us/call, bare / ours | client CPU us/call, bare / ours | bound, bare / ours | errors |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|"
)


OPENENV = ["-m", "rl_llm.integrations.openenv", "--env", ENV_ID, "-k", f"horizon={HORIZON}", "--port", "{port}",
           "--max-sessions", "1100", "--max-episodes", "1100"]  # fmt: skip


def alternated(args: argparse.Namespace, clients: int, first: tuple[str, int, str], second: tuple[str, int, str]
               ) -> tuple[Point, Point]:  # fmt: skip
    """One point of two servers (each ``(url, pid, proto)``), measured in turn ``--rounds`` times so that drift
    on the shared machine hits both alike."""
    points = Point(0, 0.0, [], 0), Point(0, 0.0, [], 0)
    for _ in range(args.rounds):
        for point, (url, pid, proto) in zip(points, (first, second)):
            point.add(measure(url, clients, args.seconds / args.rounds, proto, pid))
    return points


def bench_http(args: argparse.Namespace, proto: str) -> None:
    """Alternate bare and ours point by point, so drift on the shared machine hits both alike. OpenEnv is
    compared with the bare app's OpenEnv routes, driven by the same client: its protocol's ceiling here."""
    print(HEADER, flush=True)
    flags = web_flags(args)
    ours_argv = OPENENV if proto.startswith("openenv") else [HERE, "--serve", "http", "--port", "{port}"]
    if proto.endswith("-replay"):  # the server with its env replayed: the server's own cost per call
        kind = "openenv-replay" if proto.startswith("openenv") else "replay"
        ours_argv = [HERE, "--serve", kind, "--port", "{port}"]
    bare_proto = proto.removesuffix("-replay")  # OpenEnv: the bare app's OpenEnv routes, the same client
    with server_process([HERE, "--serve", "bare", "--port", "{port}", *flags]) as (bare_url, bare_pid), \
         server_process([*ours_argv, *flags]) as (ours_url, ours_pid):  # fmt: skip
        for clients in args.clients:
            bare, ours = alternated(args, clients, (bare_url, bare_pid, bare_proto), (ours_url, ours_pid, proto))
            print(row(proto, clients, ours, bare), flush=True)
        if proto == "http":
            import httpx

            stats = httpx.get(ours_url + "/stats").json()
            print(f"ours: {stats['inline_calls']:,} env calls inline, {stats['pool_calls']:,} on the pool, "
                  f"{stats['inline_demotions']} demotions, {stats['overloaded']} refused with 503", flush=True)


def bench_compression(args: argparse.Namespace) -> None:
    """OpenEnv's ``/ws`` with permessage-deflate negotiated (``--ws-compression``) against the servers' default
    (off), alternated point by point in the same run: what compression costs per call, on both sides, and
    per connection. openenv-core's client (the ``websockets`` library's) offers it by default; aiohttp's,
    which drives the env server's ``/sessions/ws`` rows, does not, so those rows do not change with it."""
    print("| endpoint | clients | compressed calls/s | plain calls/s | ratio | server CPU us/call, compressed / plain | "
          "client CPU us/call, compressed / plain |\n|---|---|---|---|---|---|---|", flush=True)  # fmt: skip
    proto, stack = "openenv-ws", stack_flags(args)
    with server_process([*OPENENV, "--ws-compression", *stack]) as (deflate_url, deflate_pid), \
         server_process([*OPENENV, *stack]) as (plain_url, plain_pid):  # fmt: skip
        for clients in args.clients:
            deflate, plain = alternated(args, clients, (deflate_url, deflate_pid, proto), (plain_url, plain_pid, proto))
            print(f"| {proto} | {clients} | {deflate.rate:,.0f} | {plain.rate:,.0f} | "
                  f"{plain.rate / deflate.rate:.2f}x | {deflate.cpu_us:.0f} / {plain.cpu_us:.0f} | "
                  f"{deflate.client_cpu_us:.0f} / {plain.client_cpu_us:.0f} |", flush=True)  # fmt: skip
        print(f"{proto}: peak server RSS {rss_mb(deflate_pid, 'VmHWM'):.0f} MB compressed, "
              f"{rss_mb(plain_pid, 'VmHWM'):.0f} MB plain, with up to {max(args.clients)} connections", flush=True)


def bench_stack(args: argparse.Namespace) -> None:
    """Both servers on uvicorn's fast stack (uvloop's event loop, httptools' HTTP parser: what ``auto`` picks
    once ``rl-llm[server]`` has installed them) against asyncio's loop and h11 (what uvicorn runs without
    them), alternated point by point: what the two packages are worth to a user of the servers."""
    missing = [name for name in ("uvloop", "httptools") if importlib.util.find_spec(name) is None]
    if missing:
        print(f"stack: skipped: {' and '.join(missing)} not installed (pip install 'rl-llm[server]')", flush=True)
        return
    print("| endpoint | clients | uvloop + httptools calls/s | asyncio + h11 calls/s | ratio | server CPU us/call, "
          "fast / plain | p99 ms, fast / plain |\n|---|---|---|---|---|---|---|", flush=True)  # fmt: skip
    compression = ["--ws-compression"] if args.ws_compression else []
    for proto in ("http", "ws", "openenv-http", "openenv-ws"):
        argv = OPENENV if proto.startswith("openenv") else [HERE, "--serve", "http", "--port", "{port}"]
        with server_process([*argv, *compression, "--loop", "uvloop", "--http", "httptools"]) as (fast_url, fast_pid), \
             server_process([*argv, *compression, "--loop", "asyncio", "--http", "h11"]) as (plain_url, plain_pid):  # fmt: skip
            for clients in args.clients:
                fast, plain = alternated(args, clients, (fast_url, fast_pid, proto), (plain_url, plain_pid, proto))
                print(f"| {proto} | {clients} | {fast.rate:,.0f} | {plain.rate:,.0f} | {fast.rate / plain.rate:.2f}x | "
                      f"{fast.cpu_us:.0f} / {plain.cpu_us:.0f} | {fast.pct(0.99):.0f} / {plain.pct(0.99):.0f} |",
                      flush=True)  # fmt: skip


# -- the servers' own cost per call, in-process -----------------------------------------------------------
def asgi_post(app: Any, path: str, body: bytes) -> Awaitable[None]:
    """One ``POST`` through ``app`` called as ASGI: no network, no uvicorn, no client."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "", "server": ("bench", 80),
             "client": ("bench", 1), "headers": [(b"host", b"bench"), (b"content-type", b"application/json")]}  # fmt: skip
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return messages.pop() if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start" and message["status"] != 200:
            raise RuntimeError(f"{path}: {message['status']}")

    return app(scope, receive, send)


async def asgi_episodes(app: Any, openenv: bool, seconds: float) -> float:
    """Microseconds per call, whole episodes one after another (64 episode ids in turn) for ``seconds``."""
    sessions = [f"e{i}" for i in range(64)]
    if not openenv:
        import httpx

        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as http:
            body = {"env_id": ENV_ID, "kwargs": {"horizon": HORIZON}, "count": 64}
            sessions = (await http.post("/sessions", json=body)).json()["session_ids"]
    calls, start, episode = 0, time.perf_counter(), 0
    while not calls or time.perf_counter() - start < seconds:  # at least one whole episode
        sid = sessions[episode % 64]
        if openenv:
            await asgi_post(app, "/reset", json.dumps({"seed": 0, "episode_id": sid}).encode())
            step = json.dumps({"action": {"message": ACTION}, "episode_id": sid}).encode()
            for _ in range(HORIZON):
                await asgi_post(app, "/step", step)
        else:
            await asgi_post(app, f"/sessions/{sid}/reset", b'{"seed": 0}')
            for _ in range(HORIZON):
                await asgi_post(app, f"/sessions/{sid}/step", json.dumps({"action": ACTION}).encode())
        calls, episode = calls + HORIZON + 1, episode + 1
    return (time.perf_counter() - start) / calls * 1e6


def bench_asgi(args: argparse.Namespace) -> None:
    """The servers' own cost per plain-HTTP call, each app called in this process as ASGI (no network,
    uvicorn or client): the bare app against the env server and the OpenEnv server, with the env and
    replayed, with their fast routes and without (docs/serving.md#fast-routes)."""
    import rl_llm.integrations.openenv as openenv
    from rl_llm.integrations.http_server import EnvServer, ServerConfig

    def env_server(fast: bool, replay: bool) -> Any:
        config = ServerConfig(allowed_env_ids=frozenset({ENV_ID}), max_sessions=12000, fast_routes=fast)
        return EnvServer(config, make_env=replayed_env() if replay else None).app

    def openenv_server(fast: bool, replay: bool) -> Any:
        openenv.make_env = replayed_env() if replay else built  # the adapter builds every env through it
        return openenv.create_openenv_app(ENV_ID, {"horizon": HORIZON}, 1100, 1100, fast_path=fast)

    print("| app (in-process ASGI, plain HTTP) | us per call, ours / bare | ratio of times |\n|---|---|---|", flush=True)
    bare, built = bare_app(), openenv.make_env
    for label, build, is_openenv in (("env server", env_server, False), ("OpenEnv server", openenv_server, True)):
        for fast in (True, False):
            for replay in (False, True):
                try:
                    app, per_call = build(fast, replay), {}
                    for name, target in (("bare", bare), ("ours", app)):
                        per_call[name] = min(asyncio.run(asgi_episodes(target, is_openenv, args.seconds / 2 / args.rounds))
                                             for _ in range(args.rounds))  # fmt: skip
                finally:
                    openenv.make_env = built
                what = f"{label}, {'fast routes' if fast else 'FastAPI routes only'}{', env replayed' if replay else ''}"
                print(f"| {what} | {per_call['ours']:.0f} / {per_call['bare']:.0f} | "
                      f"{per_call['ours'] / per_call['bare']:.2f}x |", flush=True)  # fmt: skip


def bench_memory(args: argparse.Namespace) -> None:
    import httpx

    with server_process([HERE, "--serve", "http", "--port", "{port}"]) as (url, pid), httpx.Client(base_url=url) as c:
        before = rss_mb(pid)
        for _ in range(args.sessions // 1000):
            ids = c.post("/sessions", json={"env_id": ENV_ID, "kwargs": {"horizon": HORIZON}, "count": 1000}).json()
            c.post("/batch/reset", json={"items": [{"session_id": s, "seed": 0} for s in ids["session_ids"]]})
        after = rss_mb(pid)
        print(f"memory: {args.sessions} open bandit sessions: server RSS {before:.0f} -> {after:.0f} MB, "
              f"{(after - before) * 1024 / args.sessions:.1f} KB per session", flush=True)  # fmt: skip


QUERIES = ["capital city river", "who founded the company", "year the bridge opened", "largest lake in the region",
           "author of the novel", "mountain height", "population of the town", "inventor of the device"]  # fmt: skip


def bench_retriever(args: argparse.Namespace) -> None:
    """The retriever server (BM25 over the bundled knowledge base, micro-batched) with one query per request,
    against the same index searched in-process in batches of 64: the server's cost per query."""
    from rl_llm.envs.knowledge import bundled_kb
    from rl_llm.envs.retrieval.bm25 import BM25Retriever

    retriever = BM25Retriever(bundled_kb(0).passages)
    queries = [QUERIES[i % len(QUERIES)] + f" {i % 97}" for i in range(4096)]
    start, done = time.perf_counter(), 0
    while time.perf_counter() - start < args.seconds / 2:
        retriever.search_batch(queries[done % 4096:done % 4096 + 64] or queries[:64], 3)
        done += 64
    direct = done / (time.perf_counter() - start)

    async def setup(http: Any) -> Any:
        return http

    def retrieve(url: str) -> Any:
        async def episode(http: Any, record: Callable[[float], None]) -> None:
            t = time.perf_counter()
            async with http.post(url + "/retrieve", json={"queries": [QUERIES[int(t * 1e6) % 8]], "topk": 3}) as r:
                await r.read()
                if r.status != 200:
                    raise RuntimeError(r.status)
            record(time.perf_counter() - t)

        return episode

    argv = ["-m", "rl_llm.envs.retrieval.server", "--bundled", "--port", "{port}"]
    with server_process(argv, url_path="/health") as (url, _):
        print("| retriever clients | in-process queries/s (batches of 64) | server queries/s | ratio | p50 ms | p99 ms |\n"
              "|---|---|---|---|---|---|", flush=True)  # fmt: skip
        for clients in [c for c in args.clients if c > 1][:2] or [64]:
            point = asyncio.run(run_load(clients, args.seconds, retrieve(url), setup))
            print(f"| {clients} | {direct:,.0f} | {point.rate:,.0f} | {point.rate / direct:.2f}x | "
                  f"{point.pct(0.5):.1f} | {point.pct(0.99):.1f} |", flush=True)


def sandbox_session(backend: str, stop: float, starts_s: list[float], steps_s: list[float]) -> None:
    from rl_llm.sandboxes import make

    t = time.perf_counter()
    sandbox = make(backend, wall_timeout=10.0)
    starts_s.append(time.perf_counter() - t)
    try:
        with sandbox.session() as shell:
            while time.perf_counter() < stop:
                t = time.perf_counter()
                shell.run("echo step && ls / > /dev/null")
                steps_s.append(time.perf_counter() - t)
    finally:
        sandbox.close()


def bench_sandboxes(args: argparse.Namespace) -> None:
    """Concurrent sandboxed sessions (bwrap, and docker where an engine answers): each of N threads starts a
    sandbox, runs shell steps (``echo``, ``ls``) in it for the point's seconds, and closes it. Start latency
    is measured under the start cap (rl_llm.sandboxes.factory.starts); step latency against one session
    alone, measured in the same run: where the ratio passes 2x, the machine is full."""
    from concurrent.futures import ThreadPoolExecutor

    from rl_llm.sandboxes import backend_problem
    from rl_llm.sandboxes.factory import starts

    print("| backend | sessions in flight | start p50 ms | start p99 ms | step p50 ms | step p99 ms | "
          "step p50 vs 1 session | steps/s |\n|---|---|---|---|---|---|---|---|", flush=True)  # fmt: skip
    for backend in ("bwrap", "docker"):
        problem = backend_problem(backend)
        if problem is not None:
            print(f"| {backend} | skipped: {problem} |", flush=True)
            continue
        alone = None
        for sessions in args.sandbox_sessions:
            starts_s: list[float] = []
            steps_s: list[float] = []
            stop = time.perf_counter() + args.seconds + 0.05 * sessions  # starts take their turn first
            begin = time.perf_counter()
            with ThreadPoolExecutor(sessions) as pool:
                list(pool.map(lambda _, b=backend, s=stop, a=starts_s, o=steps_s: sandbox_session(b, s, a, o),
                              range(sessions)))  # fmt: skip
            elapsed = time.perf_counter() - begin
            start, step = Point(0, 1, starts_s, 0), Point(len(steps_s), elapsed, steps_s, 0)
            alone = alone or step.pct(0.5)
            print(f"| {backend} | {sessions} | {start.pct(0.5):.0f} | {start.pct(0.99):.0f} | {step.pct(0.5):.1f} | "
                  f"{step.pct(0.99):.1f} | {step.pct(0.5) / alone:.2f}x | {step.rate:,.0f} |", flush=True)
    print(f"start cap: {starts.stats()}", flush=True)


# -- whole Terminal-v0 episodes (the `terminal` part) -------------------------------------------------------
TERMINAL_ID = "rl-llm/Terminal-v0"


@dataclass
class EpisodeTimes:
    """One thread's whole Terminal-v0 episodes, in seconds per call."""

    first_resets: list[float] = field(default_factory=list)  # the env's first reset: its sandbox starts (under
    # the start cap), then the task is set up
    resets: list[float] = field(default_factory=list)  # later resets: the env's sandbox is wiped, then set up
    steps: list[float] = field(default_factory=list)  # the oracle's command steps: one shell command each
    checks: list[float] = field(default_factory=list)  # each episode's last step: the shell stops, the check runs
    episodes: int = 0
    solved: int = 0  # episodes with reward 1: the check passed
    errors: list[str] = field(default_factory=list)

    def add(self, other: EpisodeTimes) -> None:
        self.first_resets += other.first_resets
        self.resets += other.resets
        self.steps += other.steps
        self.checks += other.checks
        self.episodes += other.episodes
        self.solved += other.solved
        self.errors += other.errors


def pct_ms(values: list[float], q: float) -> float:
    return Point(len(values), 1.0, values, 0).pct(q)


def doubles_at(step_p50: list[tuple[int, float]], factor: float = 2.0) -> str:
    """The first number in flight whose step p50 is at least ``factor`` times the first point's (the baseline,
    one episode alone, measured in the same run), or up to where it was not reached."""
    (base_n, base), rest = step_p50[0], step_p50[1:]
    if not base > 0:  # no steps at the baseline (every episode failed): nothing to compare with
        return f"no step p50 at N={base_n} to compare with"
    for n, p50 in rest:
        if p50 >= factor * base:
            return f"step p50 doubles at N={n} ({p50 / base:.2f}x N={base_n})"
    return f"step p50 does not double: not reached up to N={step_p50[-1][0]}"


def play_terminal(env: Any, oracle: Any, seed: int, first: bool, times: EpisodeTimes) -> None:
    """One whole episode: reset, then the oracle's turns (its task's solution commands, then done) through the
    env's own parser, until the episode ends."""
    from rl_llm.agents.policy import EpisodeStart, as_completion
    from rl_llm.types import Message

    t = time.perf_counter()
    observation, info = env.reset(seed=seed)
    (times.first_resets if first else times.resets).append(time.perf_counter() - t)
    agent = oracle.start_episode(EpisodeStart(env, info, seed=seed))
    messages = [Message("system", info["system_prompt"]), Message("user", observation)]
    done, reward = False, 0.0
    while not done:
        action = as_completion(agent.act(messages)).text
        t = time.perf_counter()
        observation, reward, terminated, truncated, info = env.step(action)
        done = terminated or truncated
        (times.checks if done else times.steps).append(time.perf_counter() - t)
        messages += [Message("assistant", action), Message("user", observation)]
    times.episodes += 1
    times.solved += reward == 1.0


def terminal_worker(backend: str, seconds: float, first_seed: int) -> EpisodeTimes:
    """Episodes on one env: the first (its sandbox starts), then more for ``seconds`` after it ends, so every
    point measures steady episodes however long the first ones queued. An episode that raises is counted and
    its error kept; the next episode begins with a reset, as a rollout's would."""
    import gymnasium as gym

    from rl_llm.agents.baselines.terminal import TerminalOracle

    times = EpisodeTimes()
    env = gym.make(TERMINAL_ID, sandbox=backend)
    oracle, seed, first, stop = TerminalOracle(), first_seed, True, 0.0
    try:
        while True:
            try:
                play_terminal(env, oracle, seed, first, times)
            except Exception as exc:  # a failure is counted and printed, never hidden
                times.errors.append(f"seed {seed}: {type(exc).__name__}: {exc}")
            if first:
                stop = time.perf_counter() + seconds
            first, seed = False, seed + 1
            if time.perf_counter() >= stop:
                break
    finally:
        env.close()
    return times


def terminal_burst(backend: str, n: int, limit: int) -> str:
    """``n`` fresh envs reset at once (released together by a barrier) with the start cap at ``limit``: the
    starts past the cap queue for a slot instead of failing (docs/serving.md#sandboxes-at-fleet-scale)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import gymnasium as gym

    from rl_llm.sandboxes.factory import starts

    envs = [gym.make(TERMINAL_ID, sandbox=backend) for _ in range(n)]
    barrier = threading.Barrier(n, timeout=120)
    latencies: list[float] = []
    errors: list[str] = []

    def reset(i: int) -> None:
        barrier.wait()
        t = time.perf_counter()
        try:
            envs[i].reset(seed=900_000 + i)
            latencies.append(time.perf_counter() - t)
        except Exception as exc:  # counted and printed
            errors.append(f"{type(exc).__name__}: {exc}")

    before = starts.stats()
    starts.set_limit(limit)
    try:
        with ThreadPoolExecutor(n) as pool:
            list(pool.map(reset, range(n)))
    finally:
        starts.set_limit(before["limit"])
        for env in envs:
            env.close()
    after = starts.stats()
    # The gate's peak is a process-wide maximum: it is this burst's only when no sandbox started before it.
    peak = f"peak {after['peak']} starting at once" if before["started"] == 0 else "peak not separable"
    line = (f"{backend} burst: {n} resets released at once, start cap {limit}: {len(errors)} failed, "
            f"{after['waited'] - before['waited']} of {after['started'] - before['started']} sandbox starts "
            f"waited for a slot ({peak}), reset p50 {pct_ms(latencies, 0.5):.0f} ms, "
            f"p99 {pct_ms(latencies, 0.99):.0f} ms")
    return "\n".join([line, *(f"  error: {e}" for e in errors[:3])])


def bench_terminal(args: argparse.Namespace) -> None:
    """Concurrent whole Terminal-v0 episodes (bwrap, and docker where an engine answers), the env's own sandbox
    backend and the oracle baseline: N threads each play episodes on their own env for the point's seconds.
    Step latency is set against one episode alone, measured in the same run: where it passes 2x, the
    machine is full. Before the points, a burst of resets against a low start cap."""
    from concurrent.futures import ThreadPoolExecutor

    from rl_llm.sandboxes import backend_problem

    for backend in ("bwrap", "docker"):
        problem = backend_problem(backend)
        if problem is not None:
            print(f"terminal episodes on {backend}: skipped: {problem}", flush=True)
            continue
        # The burst first: with no sandbox started before it in this process, the start gate's peak is its own.
        print(terminal_burst(backend, args.terminal_burst, args.terminal_start_limit), flush=True)
        print("| backend | episodes in flight | first reset p50 / p99 ms (sandbox start + setup) | "
              "reset p50 / p99 ms (sandbox wipe + setup) | step p50 / p99 ms | check step p50 / p99 ms | "
              "step p50 vs 1 episode | episodes/s | solved | errors |\n"
              "|---|---|---|---|---|---|---|---|---|---|", flush=True)  # fmt: skip
        points: list[tuple[int, float]] = []
        for n in sorted(args.terminal_episodes):
            begin = time.perf_counter()
            with ThreadPoolExecutor(n) as pool:
                parts = list(pool.map(lambda i, b=backend: terminal_worker(b, args.seconds, 10_000 * i), range(n)))
            elapsed = time.perf_counter() - begin
            times = EpisodeTimes()
            for part in parts:
                times.add(part)
            errors = times.errors
            step = pct_ms(times.steps, 0.5)
            points.append((n, step))
            base = points[0][1]
            print(f"| {backend} | {n} | {pct_ms(times.first_resets, 0.5):.0f} / {pct_ms(times.first_resets, 0.99):.0f}"
                  f" | {pct_ms(times.resets, 0.5):.0f} / {pct_ms(times.resets, 0.99):.0f} | {step:.1f} / "
                  f"{pct_ms(times.steps, 0.99):.1f} | {pct_ms(times.checks, 0.5):.0f} / {pct_ms(times.checks, 0.99):.0f}"
                  f" | {step / base:.2f}x | {times.episodes / elapsed:.2f} | "
                  f"{times.solved / max(1, times.episodes):.0%} of {times.episodes} | {len(errors)} |", flush=True)
            for error in errors[:3]:
                print(f"  error: {error}", flush=True)
        print(f"{backend}: {doubles_at(points)}", flush=True)


def main() -> None:
    from rl_llm.integrations.http_server import WEB_STACK_MODULES

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--serve", choices=["bare", "http", "replay", "openenv-replay"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, default=4.0, help="seconds per point (default 4)")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 64, 256, 1000])
    parser.add_argument("--rounds", type=int, default=2, help="alternate bare/ours this many times per point")
    parser.add_argument("--sessions", type=int, default=10000, help="open sessions for the memory figure")
    parts = [*EPISODES, "compression", "stack", "asgi", "memory", "retriever", "terminal", "sandboxes"]
    parser.add_argument("--sandbox-sessions", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--terminal-episodes", type=int, nargs="+", default=[1, 4, 16, 64],
                        help="Terminal-v0 episodes in flight per point; the smallest is the baseline")
    parser.add_argument("--terminal-burst", type=int, default=64, help="resets released at once in the burst")
    parser.add_argument("--terminal-start-limit", type=int, default=8, help="the start cap during the burst")
    parser.add_argument("--only", nargs="+", default=parts, choices=parts)
    parser.add_argument("--ws-compression", action="store_true",
                        help="every server negotiates permessage-deflate on WebSockets (their default: off)")
    parser.add_argument("--loop", choices=["auto", *WEB_STACK_MODULES["loop"]], default="auto",
                        help="every server's event loop (default auto: uvloop where installed)")
    parser.add_argument("--http", choices=["auto", *WEB_STACK_MODULES["http"]], default="auto",
                        help="every server's HTTP parser (default auto: httptools where installed)")
    args = parser.parse_args()
    if min([*args.terminal_episodes, args.terminal_burst, args.terminal_start_limit]) < 1:
        parser.error("--terminal-episodes, --terminal-burst and --terminal-start-limit take positive numbers")
    if args.serve:
        return serve(args.serve, args.port, web_flags(args))
    from rl_llm.integrations.http_server import web_stack

    print(f"serving benchmark: {os.cpu_count()} CPUs, {args.seconds:g} s per point, {ENV_ID} horizon {HORIZON}; "
          f"every server on --loop {args.loop} --http {args.http}, installed: {web_stack()}")
    for proto in EPISODES:
        if proto in args.only:
            bench_http(args, proto)
    if "compression" in args.only:
        bench_compression(args)
    if "stack" in args.only:
        bench_stack(args)
    if "asgi" in args.only:
        bench_asgi(args)
    if "memory" in args.only:
        bench_memory(args)
    if "retriever" in args.only:
        bench_retriever(args)
    if "terminal" in args.only:  # before `sandboxes`, so the burst is the process's first sandbox starts
        bench_terminal(args)
    if "sandboxes" in args.only:
        bench_sandboxes(args)


if __name__ == "__main__":
    main()
