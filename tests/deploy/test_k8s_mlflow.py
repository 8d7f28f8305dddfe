"""deploy/k8s/mlflow.yaml's server, run on this machine exactly as its Deployment configures it (command, arguments,
environment, the auth config of its ConfigMap, the Secrets' keys), on a PostgreSQL server that, like the
postgres.yaml StatefulSet, has a user mlflow with a password, the database mlflow and the init script's databases.
Only what needs a cluster is swapped: the listening address and port, the database's address, a local folder for the
S3 artifact bucket. Marked ``cluster`` (``make test-cluster``): it starts servers; about 40 s.

Shows: the store URIs without a password work (the driver reads PGPASSWORD), a request without credentials gets 401,
the admin's gets in under every Host header the Ray pods and a port-forward send and no other, a run logged as the
Ray pods log lands in PostgreSQL, and MLflow's user store is the database mlflow_auth.
"""

from __future__ import annotations

import base64
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from k8s_manifests import load_docs, option

pytestmark = pytest.mark.cluster

DOCS = {(d.kind, d.name): d.body for d in load_docs()}
DEPLOYMENT = DOCS[("Deployment", "ropim-mlflow")]
CONTAINER = DEPLOYMENT["spec"]["template"]["spec"]["containers"][0]
PROBE = "/api/2.0/mlflow/experiments/search?max_results=1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def as_postgres(*cmd: str) -> list[str]:
    """``cmd`` as the ``postgres`` user (initdb refuses root) when this is root."""
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else list(cmd)


@pytest.fixture(scope="module")
def secret_values() -> dict[tuple[str, str], str]:
    """The Secrets' keys the manifests read, with random values (as README.md makes them)."""
    return {(name, key): secrets.token_urlsafe(32) for name, key in
            (("ropim-postgres", "password"), ("ropim-mlflow", "admin-password"), ("ropim-mlflow", "flask-secret-key"))}


@pytest.fixture(scope="module")
def postgres(secret_values) -> Iterator[tuple[str, Path]]:
    """(host:port, the folder of its programs) of a PostgreSQL server set up as postgres.yaml's: user mlflow with the
    Secret's password (scram-sha-256 for every connection), database mlflow, then the init ConfigMap's SQL."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb")) or [Path(p) for p in [shutil.which("initdb")] if p]
    if not found or (os.geteuid() == 0 and shutil.which("runuser") is None):
        pytest.skip("PostgreSQL's initdb (or runuser, to leave root) is not installed")
    bin_dir = found[-1].parent
    folder = Path(tempfile.mkdtemp(prefix="ropim-k8s-pg-"))  # outside pytest's root-only temp root: postgres reads it
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres", "postgres")
    data, port = folder / "data", free_port()
    password = folder / "password"
    password.write_text(secret_values[("ropim-postgres", "password")])
    if os.geteuid() == 0:
        shutil.chown(password, "postgres", "postgres")
    client_env = {**os.environ, "PGPASSWORD": secret_values[("ropim-postgres", "password")]}
    connect = ["-h", "127.0.0.1", "-p", str(port), "-U", "mlflow"]
    try:
        run = {"check": True, "capture_output": True, "timeout": 120}
        subprocess.run(as_postgres(str(bin_dir / "initdb"), "-D", str(data), "-U", "mlflow", f"--pwfile={password}",
                                   "-A", "scram-sha-256", "--no-sync"), **run)
        subprocess.run(as_postgres(str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(folder / "server.log"), "-w",
                                   "-o", f"-p {port} -k {folder} -c listen_addresses=127.0.0.1", "start"), **run)
        subprocess.run([str(bin_dir / "createdb"), *connect, "mlflow"], env=client_env, **run)
        for sql in DOCS[("ConfigMap", "ropim-postgres-init")]["data"].values():
            subprocess.run([str(bin_dir / "psql"), *connect, "-d", "mlflow", "-v", "ON_ERROR_STOP=1", "-c", sql],
                           env=client_env, **run)
        yield f"127.0.0.1:{port}", bin_dir
    finally:
        subprocess.run(as_postgres(str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"),
                       capture_output=True, timeout=60)
        shutil.rmtree(folder, ignore_errors=True)


def container_env(secret_values: dict, replace: dict[str, str], auth_config: Path) -> dict[str, str]:
    """The container's environment: its values (addresses replaced), its Secrets' values, the auth config file."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "PG"))}
    for item in CONTAINER["env"]:
        if "valueFrom" in item:
            ref = item["valueFrom"]["secretKeyRef"]
            env[item["name"]] = secret_values[(ref["name"], ref["key"])]
        else:
            env[item["name"]] = item["value"]
            for old, new in replace.items():
                env[item["name"]] = env[item["name"]].replace(old, new)
    env["MLFLOW_AUTH_CONFIG_PATH"] = str(auth_config)
    return env


@pytest.fixture(scope="module")
def server(postgres, secret_values, tmp_path_factory) -> Iterator[str]:
    """The Deployment's ``mlflow server`` on 127.0.0.1; yields its base URL."""
    work = tmp_path_factory.mktemp("mlflow")
    replace = {"ropim-postgres:5432": postgres[0]}
    (volume,) = DEPLOYMENT["spec"]["template"]["spec"]["volumes"]
    config_map = DOCS[("ConfigMap", volume["configMap"]["name"])]["data"]
    config_name = CONTAINER["env"][[e["name"] for e in CONTAINER["env"]].index("MLFLOW_AUTH_CONFIG_PATH")]["value"]
    auth_config = work / Path(config_name).name
    text = config_map[auth_config.name]
    for old, new in replace.items():
        text = text.replace(old, new)
    auth_config.write_text(text)
    port = free_port()
    local = {"--host": "127.0.0.1", "--port": str(port), "--artifacts-destination": str(work / "artifacts")}
    args = [f"{a.split('=')[0]}={local[a.split('=')[0]]}" if a.split("=")[0] in local else a for a in CONTAINER["args"]]
    command = [str(Path(sys.executable).with_name(CONTAINER["command"][0])), *CONTAINER["command"][1:], *args]
    log = work / "server.log"
    with log.open("w") as out:
        proc = subprocess.Popen(command, env=container_env(secret_values, replace, auth_config), stdout=out,
                                stderr=subprocess.STDOUT, cwd=work, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"mlflow server did not come up:\n{log.read_text()[-3000:]}")
                time.sleep(1)
        yield f"http://127.0.0.1:{port}"
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)


def status(url: str, host: str, user: tuple[str, str] | None = None) -> int:
    request = urllib.request.Request(url, headers={"Host": host})
    if user:
        request.add_header("Authorization", "Basic " + base64.b64encode(":".join(user).encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code


def test_the_deployments_server_admits_the_admin_only_under_its_names(server, secret_values):
    admin = ("admin", secret_values[("ropim-mlflow", "admin-password")])
    ray_hosts = {urlsplit(e["value"]).netloc for d in DOCS.values() if d["kind"] in ("RayCluster", "RayJob")
                 for e in _ray_env(d) if e["name"] == "MLFLOW_TRACKING_URI"}
    assert ray_hosts == {"ropim-mlflow:5000"}
    assert status(server + PROBE, "ropim-mlflow:5000") == 401
    assert status(server + PROBE, "ropim-mlflow:5000", ("admin", "not-the-password")) == 401
    for host in (*ray_hosts, "localhost:5000", "127.0.0.1:5000"):  # the Ray pods; kubectl port-forward
        assert status(server + PROBE, host, admin) == 200, host
    assert status(server + PROBE, "attacker.example:5000", admin) in (400, 403)
    assert option(CONTAINER["args"], "--app-name") == "basic-auth"


def _ray_env(body: dict) -> list[dict]:
    spec = body["spec"].get("rayClusterSpec") or body["spec"]
    return spec["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]


def test_a_run_logged_as_the_ray_pods_log_lands_in_postgresql(server, postgres, secret_values):
    env = {**os.environ, "MLFLOW_TRACKING_URI": server, "MLFLOW_TRACKING_USERNAME": "admin",
           "MLFLOW_TRACKING_PASSWORD": secret_values[("ropim-mlflow", "admin-password")]}
    script = ("import mlflow\nwith mlflow.start_run() as run:\n    mlflow.log_metric('loss', 0.5)\n"
              "    mlflow.log_text('hi', 'note.txt')\nprint(run.info.run_id)")
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_id = proc.stdout.split()[-1]
    (host, port), psql = postgres[0].split(":"), postgres[1] / "psql"
    query = {**os.environ, "PGPASSWORD": secret_values[("ropim-postgres", "password")]}

    def select(database: str, sql: str) -> str:
        return subprocess.run([str(psql), "-h", host, "-p", port, "-U", "mlflow", "-d", database, "-tA", "-c", sql],
                              env=query, check=True, capture_output=True, text=True, timeout=60).stdout.strip()

    assert select("mlflow", f"select value from metrics where run_uuid = '{run_id}' and key = 'loss'") == "0.5"
    assert select("mlflow_auth", "select username from users") == "admin"
