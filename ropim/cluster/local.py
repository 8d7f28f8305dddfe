"""The local cluster's pieces: where everything lives, how Ray's head and the MLflow server start, and whether they
answer. ``ropim.cluster.__main__`` puts them together as ``up``, ``down``, ``status``.

Everything listens on 127.0.0.1 only (tests/cluster/test_cluster_job.py checks every socket). ``ray start
--node-ip-address=127.0.0.1`` alone is not enough on Linux: Ray replaces a loopback node IP with the machine's
address. With ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (Ray's single-machine mode, the default on macOS and Windows)
the node IP stays 127.0.0.1 and Ray 2.60 binds its gRPC servers, agents, client server and metrics servers to it.
Every Ray process inherits the variable, job drivers included; a client that talks to the GCS directly (``ray
status``, ``ray.init(address=...)``) needs it too.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from ropim.cluster import mlflow_auth
from ropim.cluster.processes import Service, members, stop

SINGLE_MACHINE = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
SOCKET_PATH_MAX = 107  # Ray's unix sockets live under its session dir
PORTS = {  # variable: default. Off Ray's defaults, so that they do not collide with a developer's own Ray.
    "RAY_PORT": 6380, "DASH_PORT": 8266, "MLFLOW_PORT": 5001, "RAY_CLIENT_PORT": 10011, "RAY_DASH_AGENT_PORT": 52375,
    "RAY_AUTOSCALER_METRIC_PORT": 44237, "RAY_DASHBOARD_METRIC_PORT": 44247, "RAY_MIN_WORKER_PORT": 20002,
    "RAY_MAX_WORKER_PORT": 29999,
}
GRACE_S = 10  # SIGTERM, then this long, then SIGKILL
RAY_LISTEN = ("RAY_PORT", "DASH_PORT", "RAY_CLIENT_PORT", "RAY_DASH_AGENT_PORT")  # checked free before `up`


class ClusterError(Exception):
    """One line for the user: what went wrong and what to do."""


def say(message: str) -> None:
    print(f"cluster: {message}", flush=True)


@dataclass
class Settings:
    """Where the local cluster lives and listens, from the environment (the variables of ``PORTS``, ``CLUSTER_DIR``
    (default ``./.cluster``), ``RAY_TEMP_DIR`` (``$CLUSTER_DIR/ray``), ``RAY_NUM_CPUS`` (2), ``UP_TIMEOUT`` (120 s),
    ``MLFLOW_WORKERS`` (1), ``RAY_AUTH_TOKEN_PATH`` (``~/.ray/auth_token``)). Ray and MLflow are the programs beside
    this Python."""

    ports: dict[str, int]
    folder: Path
    temp_dir: Path
    token_file: Path
    num_cpus: int = 2
    up_timeout: float = 120
    mlflow_workers: int = 1
    bin: Path = field(default_factory=lambda: Path(sys.executable).parent)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        folder = Path(env.get("CLUSTER_DIR") or ".cluster").absolute()
        return cls(ports={k: int(env.get(k) or v) for k, v in PORTS.items()}, folder=folder,
                   temp_dir=Path(env.get("RAY_TEMP_DIR") or folder / "ray").absolute(),
                   token_file=Path(env.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token"),
                   num_cpus=int(env.get("RAY_NUM_CPUS") or 2), up_timeout=float(env.get("UP_TIMEOUT") or 120),
                   mlflow_workers=int(env.get("MLFLOW_WORKERS") or 1))

    def path(self, name: str) -> Path:
        return self.folder / name

    @property
    def password_file(self) -> Path:
        return self.path("mlflow-password")

    @property
    def auth_db_uri(self) -> str:
        return f"sqlite:///{self.path('mlflow-auth.db')}"

    @property
    def mlflow_uri(self) -> str:
        return f"http://127.0.0.1:{self.ports['MLFLOW_PORT']}"

    @property
    def ray(self) -> Service:
        return Service("ray", self.folder, (self.folder, self.temp_dir), self.temp_dir)

    @property
    def mlflow(self) -> Service:
        return Service("mlflow", self.folder, (self.folder, self.temp_dir))


def port_busy(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return True
    return False


def ray_healthy(s: Settings) -> bool:
    """``ray status`` answers (token auth) and the dashboard's GCS health check says so."""
    try:
        status = subprocess.run([str(s.bin / "ray"), "status", "--address", f"127.0.0.1:{s.ports['RAY_PORT']}"],
                                env={**os.environ, **SINGLE_MACHINE, "RAY_AUTH_MODE": "token"}, timeout=20,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return False
    healthz = f"http://127.0.0.1:{s.ports['DASH_PORT']}/api/gcs_healthz"
    return status.returncode == 0 and mlflow_auth.http_status(healthz) == 200


def mlflow_healthy(s: Settings) -> bool:
    return mlflow_auth.http_status(f"{s.mlflow_uri}/health") == 200


def mlflow_auth_status(s: Settings) -> tuple[int, int | str]:
    """HTTP status of a request without credentials (401 when auth is on) and of one as admin (200)."""
    probe = s.mlflow_uri + mlflow_auth.PROBE
    if not (s.password_file.is_file() and s.password_file.stat().st_size):
        return mlflow_auth.http_status(probe), f"none (no {s.password_file})"
    return mlflow_auth.http_status(probe), mlflow_auth.http_status(probe, mlflow_auth.read_secret(s.password_file))


def ensure_ray_token(s: Settings) -> None:
    """``ray start`` turns token auth on only when a token already exists (unlike ``ray.init`` it never makes one),
    so on a fresh machine it would open the job API to anyone: a token from the environment (``RAY_AUTH_TOKEN``), or
    the one in ``token_file``, made here (random, mode 0600) when there is none. ``ray get-auth-token --generate``
    writes ``~/.ray/auth_token`` only, whatever ``RAY_AUTH_TOKEN_PATH`` says."""
    if os.environ.get("RAY_AUTH_TOKEN") and not s.token_file.exists():
        return  # the token comes from the environment
    mlflow_auth.ensure_secret(s.token_file)  # one made earlier (ray.init) may be readable by others: 0600 now


def prepare_mlflow_auth(s: Settings) -> None:
    """The admin password, the CSRF key and the config of MLflow's basic-auth app (``ropim.cluster.mlflow_auth``)."""
    mlflow_auth.check_admin_password(s.auth_db_uri, s.password_file)
    mlflow_auth.ensure_secret(s.password_file)
    mlflow_auth.ensure_secret(s.path("mlflow-flask-secret"))
    mlflow_auth.write_config(s.path("mlflow-auth.ini"), s.auth_db_uri)


def ray_start_argv(s: Settings) -> list[str]:
    p = s.ports
    return [str(s.bin / "ray"), "start", "--head", "--node-ip-address=127.0.0.1", f"--port={p['RAY_PORT']}",
            f"--num-cpus={s.num_cpus}", "--dashboard-host=127.0.0.1", f"--dashboard-port={p['DASH_PORT']}",
            "--include-dashboard=true", f"--ray-client-server-port={p['RAY_CLIENT_PORT']}",
            f"--dashboard-agent-listen-port={p['RAY_DASH_AGENT_PORT']}",
            f"--min-worker-port={p['RAY_MIN_WORKER_PORT']}", f"--max-worker-port={p['RAY_MAX_WORKER_PORT']}",
            f"--temp-dir={s.temp_dir}", "--disable-usage-stats"]


def start_ray(s: Settings, t0: float) -> None:
    """``ray start --head`` in its own session; its environment (token mode, the MLflow URI and credentials) is
    inherited by every Ray process, so job drivers on this head need no runtime env (whose env_vars Ray logs)."""
    probe = s.temp_dir / "session_2000-01-01_00-00-00_000000_4194304" / "sockets" / "plasma_store"
    if len(str(probe)) > SOCKET_PATH_MAX:
        raise ClusterError(f"RAY_TEMP_DIR={s.temp_dir} is too long for Ray's unix sockets; set RAY_TEMP_DIR to a "
                           "shorter path inside a private directory (e.g. RAY_TEMP_DIR=$(mktemp -d)/ray: Ray makes its "
                           "temp dir world-writable, the parent keeps others out)")
    s.temp_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # Ray chmods it 0777; CLUSTER_DIR (0700) keeps others out
    ensure_ray_token(s)
    env = {**os.environ, **SINGLE_MACHINE, "RAY_AUTH_MODE": "token", "MLFLOW_TRACKING_URI": s.mlflow_uri,
           "MLFLOW_TRACKING_USERNAME": mlflow_auth.ADMIN,
           "MLFLOW_TRACKING_PASSWORD": mlflow_auth.read_secret(s.password_file),
           "AUTOSCALER_METRIC_PORT": str(s.ports["RAY_AUTOSCALER_METRIC_PORT"]),
           "DASHBOARD_METRIC_PORT": str(s.ports["RAY_DASHBOARD_METRIC_PORT"]),
           "PATH": f"{s.bin}{os.pathsep}{os.environ.get('PATH', '')}"}
    log = s.path("ray-start.log")
    if s.ray.start(ray_start_argv(s), log, env).wait() != 0:
        sys.stderr.write(tail(log))
        stop_ray(s)
        raise ClusterError(f"ray start failed (log: {log})")
    s.ray.snapshot()  # `down` also looks again: workers come and go
    sid = s.ray.recorded_sid()
    say(f"ray head started in {time.time() - t0:.0f}s (session {sid}, {len(members(sid))} processes: {key_pids(s)})")


def key_pids(s: Settings) -> str:
    """``gcs_server=PID raylet=PID`` of the Ray head."""
    return " ".join(f"{name_of(p)}={p.pid}" for p in s.ray.processes() if name_of(p) in ("gcs_server", "raylet"))


def start_mlflow(s: Settings) -> None:
    """``mlflow server --app-name basic-auth`` in its own session: anonymous requests get 401 (``/health`` stays
    open); the secrets reach it through its environment only."""
    s.path("mlartifacts").mkdir(exist_ok=True)
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": os.environ.get("MLFLOW_SERVER_ENABLE_JOB_EXECUTION",
                                                                                "false"),
           **mlflow_auth.server_env(s.path("mlflow-auth.ini"), s.password_file, s.path("mlflow-flask-secret"))}
    argv = [str(s.bin / "mlflow"), "server", "--app-name", "basic-auth", "--host", "127.0.0.1",
            "--port", str(s.ports["MLFLOW_PORT"]), "--workers", str(s.mlflow_workers),
            "--backend-store-uri", f"sqlite:///{s.path('mlflow.db')}", "--artifacts-destination",
            str(s.path("mlartifacts"))]
    log = s.path("mlflow.log")
    proc = s.mlflow.start(argv, log, env)
    say(f"mlflow server started (session {proc.pid}, log {log})")


def stop_ray(s: Settings) -> None:
    """Stop the head in ``ray stop``'s order: raylets, then the rest, then the GCS (each SIGTERM, 10 s, SIGKILL)."""
    procs = s.ray.processes()
    if not procs:
        s.ray.forget()
        return
    raylets = [p for p in procs if name_of(p) == "raylet"]
    gcs = [p for p in procs if name_of(p) == "gcs_server"]
    say(f"stopping ray: {len(procs)} processes (raylet: {pids(raylets)} gcs_server: {pids(gcs)})")
    stop(raylets, GRACE_S, say)
    # again: workers may have exited or started meanwhile
    rest = {p.pid: p for p in procs + s.ray.processes() if name_of(p) not in ("", "raylet", "gcs_server")}
    stop(list(rest.values()), GRACE_S, say)
    stop(gcs, GRACE_S, say)
    s.ray.forget()


def stop_mlflow(s: Settings) -> None:
    procs = s.mlflow.processes()
    if procs:
        say(f"stopping mlflow: {len(procs)} processes")
        stop(procs, GRACE_S, say)
    s.mlflow.forget()


def name_of(p: psutil.Process) -> str:
    """The process's name; empty once it is gone."""
    try:
        return p.name()
    except psutil.Error:
        return ""


def pids(procs: list[psutil.Process]) -> str:
    return " ".join(str(p.pid) for p in procs) or "-"


def tail(log: Path, lines: int = 20) -> str:
    try:
        return "".join(log.read_text(errors="replace").splitlines(keepends=True)[-lines:])
    except OSError:
        return ""
