"""Fixtures for "beyond one node" tests on one machine: an S3 server (moto, a real HTTP server in its own process),
a Ray cluster of a head and two worker nodes (one can be removed, a replacement added), an MLflow server that
keeps its artifacts in the S3 bucket, and registered models served over HTTP (``mlflow models serve``).

Each fixture starts its processes itself and stops them through its own handles: nothing here stops processes by
name, and the Ray cluster lives in a private temp folder, so a developer's own Ray (in Ray's default temp folder,
``ray.init()`` without an address) neither sees nor joins it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

BUCKET = "ropim-test"
REGION = "us-east-1"
NODE_LABEL = "ropim-node"  # worker node ``name`` has the label {NODE_LABEL: name} and the resource {f"node_{name}": 1}
WORKER_CPUS = 2  # logical CPUs per worker node (they share the machine's real cores)
NO_JOBS = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}  # no Huey job consumers beside the MLflow servers
# variables from a developer's shell that would send the AWS SDKs elsewhere (profiles, tokens, roles)
AWS_UNSET = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_ROLE_ARN",
             "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CA_BUNDLE")


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``cluster`` marker (``-m "not cluster"`` leaves these tests out)."""
    config.addinivalue_line("markers", "cluster: starts servers or a multi-node Ray cluster (slow)")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_process(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start ``cmd`` in its own process group (so stopping it also stops its children), output to ``log``."""
    with open(log, "ab") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)


def stop_process(proc: subprocess.Popen, timeout: float = 15) -> None:
    """SIGTERM the process group of ``proc``, SIGKILL it if it is still there after ``timeout`` seconds."""
    if proc.poll() is not None:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout)
            return
        except subprocess.TimeoutExpired:
            continue


def wait_http(url: str, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    """Wait until ``url`` answers with any HTTP status; fail early with the log's tail if ``proc`` exits."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[:4]} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            stop_process(proc)
            raise TimeoutError(f"{url} did not answer within {timeout} s:\n{log.read_text()[-3000:]}")
        time.sleep(0.1)


@dataclass(frozen=True)
class S3Server:
    """A running S3-compatible server with one bucket, and the environment that points AWS clients at it."""

    endpoint: str  # http://127.0.0.1:PORT
    bucket: str
    env: dict[str, str]  # set in the test process while the fixture lives; pass it on to other processes

    @property
    def secret(self) -> str:
        """The secret access key (random per session: tests can assert it shows up nowhere)."""
        return self.env["AWS_SECRET_ACCESS_KEY"]

    def uri(self, *parts: str) -> str:
        """``s3://<bucket>/<parts joined by />``."""
        return "/".join([f"s3://{self.bucket}", *parts])

    def client(self) -> Any:
        """A boto3 S3 client for the server."""
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION,
                            aws_access_key_id=self.env["AWS_ACCESS_KEY_ID"], aws_secret_access_key=self.secret)

    def filesystem(self) -> Any:
        """A ``pyarrow.fs.S3FileSystem`` for the server. Its constructor ignores AWS_ENDPOINT_URL (pyarrow 25),
        so the endpoint is passed explicitly; ``FileSystem.from_uri("s3://...")`` does honour the variable."""
        from pyarrow import fs

        return fs.S3FileSystem(endpoint_override=self.endpoint, region=REGION,
                               access_key=self.env["AWS_ACCESS_KEY_ID"], secret_key=self.secret)

    def keys(self, prefix: str = "") -> list[str]:
        """The object keys under ``prefix`` in the bucket."""
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return [o["Key"] for page in pages for o in page.get("Contents", [])]


def _start_moto(workdir: Path) -> tuple[subprocess.Popen, str, Path]:
    """Start ``moto.server`` on a free port of 127.0.0.1 (a few tries, in case the port is taken meanwhile)."""
    log = workdir / "moto.log"
    for _ in range(3):
        port = free_port()
        proc = start_process([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], log)
        endpoint = f"http://127.0.0.1:{port}"
        try:
            wait_http(f"{endpoint}/moto-api/", proc, log, timeout=60)
            return proc, endpoint, log
        except RuntimeError:  # exited: most likely the port was taken after free_port()
            continue
    raise RuntimeError(f"moto server did not start:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """An S3 server (moto) on 127.0.0.1 with bucket ``ropim-test``; the AWS/MLflow variables that point boto3,
    ``pyarrow.fs.FileSystem.from_uri``, Ray Data, Ray Train storage and MLflow's S3 artifact store at it are set in
    this process (Ray nodes and servers started later inherit them)."""
    workdir = tmp_path_factory.mktemp("s3")
    proc, endpoint, log = _start_moto(workdir)
    env = {
        "AWS_ACCESS_KEY_ID": "ropim-test-key",
        "AWS_SECRET_ACCESS_KEY": f"ropim-test-secret-{secrets.token_hex(8)}",
        "AWS_REGION": REGION,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_ENDPOINT_URL": endpoint,  # boto3 >= 1.28 and pyarrow's FileSystem.from_uri
        "AWS_ENDPOINT_URL_S3": endpoint,  # wins over AWS_ENDPOINT_URL in both: set it so a developer's own can't
        "MLFLOW_S3_ENDPOINT_URL": endpoint,  # MLflow's documented variable (its S3 client also follows the above)
        "AWS_EC2_METADATA_DISABLED": "true",  # no instance-metadata probing for credentials or region
        # a developer's ~/.aws files stay out of it (they may name profiles, endpoints, regions)
        "AWS_CONFIG_FILE": str(workdir / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(workdir / "no-aws-credentials"),
    }
    patch = pytest.MonkeyPatch()
    try:
        for name in AWS_UNSET:
            patch.delenv(name, raising=False)
        for name, value in env.items():
            patch.setenv(name, value)
        server = S3Server(endpoint=endpoint, bucket=BUCKET, env=env)
        server.client().create_bucket(Bucket=BUCKET)
        yield server
    finally:
        patch.undo()
        stop_process(proc)


@dataclass
class RayCluster:
    """A Ray cluster on this machine: a head without CPUs (driver, Train controller) and named worker nodes with
    ``WORKER_CPUS`` logical CPUs each, pinnable by ``resources={f"node_{name}": 0.01}`` or
    ``label_selector={NODE_LABEL: name}``. Add and remove nodes from the main thread only (Ray installs a signal
    handler when a node starts)."""

    cluster: Any  # ray.cluster_utils.Cluster
    env: dict[str, str]  # environment given to every worker node's processes
    temp_root: Path  # RAY_TMPDIR of the cluster: sessions, logs, runtime-env records
    nodes: dict[str, Any] = field(default_factory=dict)  # name -> ray._private.node.Node, as add_node returns it
    added: int = 0  # worker nodes started so far

    @property
    def address(self) -> str:
        """The GCS address (``ray.init(address=...)``, RAY_ADDRESS for other processes)."""
        return self.cluster.address

    def node_id(self, name: str) -> str:
        """The Ray node id (hex) of worker node ``name``."""
        return self.nodes[name].node_id

    def add(self, name: str, num_cpus: int = WORKER_CPUS) -> str:
        """Start worker node ``name`` (a new one, e.g. a replacement after ``remove(name)``); return its node id."""
        if name in self.nodes:
            raise ValueError(f"node {name!r} is running; remove it first")
        # Every node its own runtime-env folder, as its own disk would give it: nodes that shared one would delete
        # a job's working_dir under its driver when another node's agent collects the package it no longer uses.
        self.added += 1
        self.nodes[name] = self.cluster.add_node(num_cpus=num_cpus, resources={f"node_{name}": 1},
                                                 labels={NODE_LABEL: name}, env_vars=self.env,
                                                 runtime_env_dir_name=f"runtime_resources_{name}{self.added}")
        return self.nodes[name].node_id

    def remove(self, name: str) -> None:
        """Kill every process of worker node ``name`` (raylet, its workers, its agents)."""
        self.cluster.remove_node(self.nodes.pop(name))

    def files_containing(self, text: str) -> list[Path]:
        """Files under the cluster's temp folder (logs of every node, runtime-env records) that contain ``text``:
        for asserting that a secret was not written down."""
        needle = text.encode()
        return [p for p in self.temp_root.rglob("*") if p.is_file() and not p.is_symlink() and needle in p.read_bytes()]


@pytest.fixture(scope="module")
def ray_cluster(s3_server: S3Server) -> Iterator[RayCluster]:
    """A head (0 CPUs, dashboard on: Train's placement-group cleaner asks it) and worker nodes ``a`` and ``b``, with
    the S3 environment; the test process is connected as the driver (on the head: drivers on this machine prefer
    it, so removing a worker node never takes a driver or Train controller with it), and RAY_ADDRESS points at
    it. Module scope: a module that removes a node gets a fresh cluster in the next module."""
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():  # e.g. a session that an earlier test opened implicitly
        ray.shutdown()
    # A private temp root: Cluster writes ``<temp>/ray/ray_current_cluster``, which ``ray.init()`` without an
    # address would follow; keep that file, the session folders and session_latest out of the default one. Short
    # path: Ray's unix sockets live under it.
    root = tempfile.mkdtemp(prefix="ropim-rc-")
    os.makedirs(os.path.join(root, "ray"))
    patch = pytest.MonkeyPatch()
    patch.setenv("RAY_TMPDIR", root)
    # Ray Train's defaults here, as users run it (tests/conftest.py polls every 0.1 s to speed up `make test`): the
    # sweep test frees node b while node a still holds its finished first trial, which a 2 s poll keeps true, and
    # the README's recovery figures were measured with them
    for name in ("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"):
        patch.delenv(name, raising=False)
    cluster = None
    try:
        cluster = Cluster(initialize_head=True, shutdown_at_exit=True, head_node_args={
            "num_cpus": 0, "include_dashboard": True, "dashboard_host": "127.0.0.1", "dashboard_port": 0,
            "dashboard_agent_listen_port": None, "temp_dir": os.path.join(root, "ray"), "env_vars": s3_server.env,
        })
        handle = RayCluster(cluster=cluster, env=dict(s3_server.env), temp_root=Path(root))
        handle.add("a")
        handle.add("b")
        cluster.wait_for_nodes()
        ray.init(address=cluster.address)
        patch.setenv("RAY_ADDRESS", cluster.address)  # subprocesses (a job script's ray.init()) join this cluster
        yield handle
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
        patch.undo()
        shutil.rmtree(root, ignore_errors=True)


@dataclass(frozen=True)
class MlflowServer:
    """A running ``mlflow server``: sqlite backend, artifacts proxied to ``artifacts`` (an S3 URI)."""

    uri: str  # http://127.0.0.1:PORT, the tracking and registry URI
    artifacts: str  # s3://<bucket>/mlartifacts
    log: Path  # the server's stdout and stderr


@contextlib.contextmanager
def served_mlflow(backend: str, artifacts: str, s3_server: S3Server, log: Path,
                  timeout: float) -> Iterator[MlflowServer]:
    """``mlflow server`` on 127.0.0.1 (one worker, no Huey job consumers): runs and registry in ``backend``,
    artifacts proxied to ``artifacts`` (an S3 URI); stopped when the block ends."""
    port = free_port()
    proc = start_process([sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
                          "--workers", "1", "--backend-store-uri", backend, "--artifacts-destination", artifacts],
                         log, env={**os.environ, **s3_server.env, **NO_JOBS})
    uri = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{uri}/health", proc, log, timeout=timeout)
        yield MlflowServer(uri=uri, artifacts=artifacts, log=log)
    finally:
        stop_process(proc)


@pytest.fixture(scope="module")
def mlflow_server(s3_server: S3Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    """``mlflow server`` on sqlite whose artifact store is ``s3://ropim-test/mlartifacts``; only the server talks to
    S3 (clients upload through it: ``mlflow-artifacts:/`` URIs)."""
    workdir = tmp_path_factory.mktemp("mlflow")
    with served_mlflow(f"sqlite:///{workdir / 'mlflow.db'}", s3_server.uri("mlartifacts"), s3_server,
                       workdir / "server.log", timeout=120) as server:
        yield server


@contextlib.contextmanager
def served_models(model_uris: list[str], folder: Path, env: dict[str, str], timeout: float) -> Iterator[list[str]]:
    """``mlflow models serve -m URI --env-manager local`` for every one of ``model_uris`` at once (three tiny models
    on 2 busy cores: healthy after 63 s at once, 127 s one after another, measured 2026-11), each on its own free
    port of 127.0.0.1 with this Python's mlflow and uvicorn (its bin folder first on PATH: the command runs
    ``uvicorn`` from PATH), logs ``serve-<i>.log`` in ``folder``; yields their URLs once each answers ``/health``
    with 200; all stopped (process groups) when the block ends, also when it fails."""
    bin_dir = str(Path(sys.executable).parent)
    env = {**env, "PATH": os.pathsep.join([bin_dir, env.get("PATH", "")])}
    servers: list[tuple[str, subprocess.Popen, Path]] = []
    try:
        ports: set[int] = set()
        for i, uri in enumerate(model_uris):
            port = free_port()
            while port in ports:
                port = free_port()
            ports.add(port)
            log = folder / f"serve-{i}.log"
            proc = start_process([sys.executable, "-m", "mlflow", "models", "serve", "-m", uri, "--env-manager",
                                  "local", "--host", "127.0.0.1", "--port", str(port)], log, env=env)
            servers.append((f"http://127.0.0.1:{port}", proc, log))
        deadline = time.monotonic() + timeout
        for url, proc, log in servers:
            wait_http(f"{url}/health", proc, log, timeout=max(0.0, deadline - time.monotonic()))
            try:
                urllib.request.urlopen(f"{url}/health", timeout=10).close()
            except urllib.error.HTTPError as err:
                raise RuntimeError(f"{url}/health answered {err.code}:\n{log.read_text()[-3000:]}") from None
        yield [url for url, _, _ in servers]
    finally:
        for _, proc, _ in servers:
            stop_process(proc)


@pytest.fixture(scope="session")
def serve_models() -> Callable[..., contextlib.AbstractContextManager[list[str]]]:
    """``served_models`` for test modules (a conftest's helpers reach them through fixtures)."""
    return served_models


@dataclass(frozen=True)
class Database:
    """Where an MLflow server keeps runs and the registry: a PostgreSQL server of its own, or sqlite."""

    uri: str  # the backend store URI
    kind: str  # "postgresql" or "sqlite"
    why: str  # why sqlite, when it is


def postgres_bin() -> Path | None:
    """The folder of PostgreSQL's server programs (initdb, pg_ctl), when installed."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if found:
        return found[-1].parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def as_postgres(*cmd: str) -> list[str]:
    """``cmd`` as the ``postgres`` user (initdb refuses root) when this is root."""
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else list(cmd)


@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Database]:
    """A PostgreSQL server on 127.0.0.1 (trust authentication, a temp data folder, stopped at the end) with a
    database ``mlflow``; sqlite when PostgreSQL or the ``postgres`` user is missing (``why`` says so)."""
    bin_dir = postgres_bin()
    if bin_dir is None or (os.geteuid() == 0 and shutil.which("runuser") is None):
        yield Database(f"sqlite:///{tmp_path_factory.mktemp('db') / 'mlflow.db'}", "sqlite",
                       "PostgreSQL's initdb is not installed" if bin_dir is None else "no runuser to leave root")
        return
    import pwd

    folder = Path(tempfile.mkdtemp(prefix="ropim-pg-"))  # outside pytest's root-only temp root: postgres reads it
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        os.chown(folder, user.pw_uid, user.pw_gid)
    data, port = folder / "data", free_port()
    run = functools.partial(subprocess.run, check=True, capture_output=True, timeout=120)
    try:
        run(as_postgres(str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "--no-sync"))
        run(as_postgres(str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(folder / "server.log"), "-w", "-o",
                        f"-p {port} -k {folder} -c listen_addresses=127.0.0.1", "start"))
        run(as_postgres(str(bin_dir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "mlflow"))
        yield Database(f"postgresql+psycopg://postgres@127.0.0.1:{port}/mlflow", "postgresql", "")
    finally:
        subprocess.run(as_postgres(str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"),
                       capture_output=True, timeout=60)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def mlflow_db_server(database: Database, s3_server: S3Server,
                     tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    """``mlflow server`` as ``mlflow_server``, its runs and registry in ``database`` (PostgreSQL when there)."""
    with served_mlflow(database.uri, s3_server.uri("mlartifacts-db"), s3_server,
                       tmp_path_factory.mktemp("mlflow-db") / "server.log", timeout=180) as server:
        yield server
