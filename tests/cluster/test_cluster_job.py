"""`make cluster-up`'s Ray head + MLflow server: locked down (every port on 127.0.0.1, private token file, MLflow
basic auth, no secret on a command line), and a `ray job submit` pretraining job still lands in the MLflow server."""

from __future__ import annotations

import base64
import ipaddress
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

pytestmark = pytest.mark.cluster  # a Ray head and an MLflow server: `make test-cluster`

ROOT = Path(__file__).resolve().parents[2]
PORTS = {  # away from the defaults so a developer's own `make cluster-up` keeps running
    "RAY_PORT": "6391", "DASH_PORT": "8277", "MLFLOW_PORT": "5011", "RAY_CLIENT_PORT": "10021",
    "RAY_DASH_AGENT_PORT": "52385", "RAY_AUTOSCALER_METRIC_PORT": "44257", "RAY_DASHBOARD_METRIC_PORT": "44267",
    "RAY_MIN_WORKER_PORT": "30002", "RAY_MAX_WORKER_PORT": "31999",
}
TRACKING = f"http://127.0.0.1:{PORTS['MLFLOW_PORT']}"
PROBE = f"{TRACKING}/api/2.0/mlflow/experiments/search?max_results=1"
# credentials a developer may have exported must not leak into the cluster or mask a missing one
CREDENTIAL_VARS = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN")
CLUSTER = [sys.executable, "-m", "ropim.cluster"]  # what `make cluster-up` / `cluster-down` run


@pytest.fixture(scope="module")
def cluster():
    # a short path: Ray's unix sockets live under the temp dir and must stay under ~107 characters
    cluster_dir = Path(tempfile.mkdtemp(prefix="rc-", dir="/tmp"))
    base = {k: v for k, v in os.environ.items() if k not in CREDENTIAL_VARS}
    env = {**base, **PORTS, "CLUSTER_DIR": str(cluster_dir)}
    try:
        up = subprocess.run([*CLUSTER, "up"], env=env, timeout=240, capture_output=True, text=True)
        if up.returncode != 0:
            pytest.fail(f"cluster up failed ({up.returncode}):\n{up.stdout[-3000:]}\n{up.stderr[-3000:]}")
        yield {"env": env, "dir": cluster_dir, "up_output": up.stdout + up.stderr}
    finally:
        subprocess.run([*CLUSTER, "down"], env=env, timeout=120, capture_output=True)
        shutil.rmtree(cluster_dir, ignore_errors=True)


def admin_password(cluster) -> str:
    return (cluster["dir"] / "mlflow-password").read_text().strip()


def http_status(url: str, user: str | None = None, password: str | None = None) -> int:
    req = urllib.request.Request(url)
    if user is not None:
        req.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code


# ------------------------------------------------------------------ the cluster's processes and their sockets


def proc_stat(pid: int) -> tuple[int, int] | None:
    """(ppid, session id) of a live process."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), int(fields[3])


def cluster_pids(cluster_dir: Path) -> set[int]:
    """Members of the sessions `up` recorded (ray.sid, mlflow.sid) and all their descendants (job drivers call
    setsid themselves but stay children of Ray's processes)."""
    sids = {int((cluster_dir / f).read_text()) for f in ("ray.sid", "mlflow.sid")}
    procs = {int(p.name): st for p in Path("/proc").iterdir() if p.name.isdigit() and (st := proc_stat(int(p.name)))}
    ours = {pid for pid, (_, sid) in procs.items() if sid in sids}
    grew = True
    while grew:
        new = {pid for pid, (ppid, _) in procs.items() if ppid in ours and pid not in ours}
        ours |= new
        grew = bool(new)
    return ours


def _listening_from_ss(pids: set[int]) -> list[tuple[str, int, int]]:
    out = subprocess.run(["ss", "-H", "-l", "-t", "-u", "-n", "-p"], capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        cols = line.split()
        # Netid State Recv-Q Send-Q Local:Port Peer:Port Process
        local = cols[4]
        for pid in map(int, re.findall(r"pid=(\d+)", line)):
            if pid in pids:
                host, port = local.rsplit(":", 1)
                found.append((host.strip("[]").split("%")[0], int(port), pid))
    return found


def _hex_addr(hexaddr: str) -> str:
    raw = bytes.fromhex(hexaddr)
    if len(raw) == 4:
        return str(ipaddress.IPv4Address(raw[::-1]))
    addr = ipaddress.IPv6Address(b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4)))  # 4 little-endian words
    return f"::ffff:{addr.ipv4_mapped}" if addr.ipv4_mapped else str(addr)


def _listening_from_proc(pids: set[int]) -> list[tuple[str, int, int]]:
    """Without `ss`: listening TCP sockets (state 0A) and bound UDP sockets from /proc/net, matched to our pids
    through the socket inodes in /proc/<pid>/fd."""
    sockets = {}
    for table, listening in (("tcp", "0A"), ("tcp6", "0A"), ("udp", "07"), ("udp6", "07")):
        try:
            lines = Path(f"/proc/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if cols[3] == listening:
                addr, port = cols[1].split(":")
                sockets[cols[9]] = (_hex_addr(addr), int(port, 16))
    found = []
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if (m := re.fullmatch(r"socket:\[(\d+)\]", target)) and m.group(1) in sockets:
                found.append((*sockets[m.group(1)], pid))
    return found


def listening_sockets(pids: set[int]) -> list[tuple[str, int, int]]:
    """(address, port, pid) of every listening socket of the given processes."""
    return _listening_from_ss(pids) if shutil.which("ss") else _listening_from_proc(pids)


def is_loopback_only(host: str) -> bool:
    if host == "*":  # ss: the wildcard address
        return False
    addr = ipaddress.ip_address(host)
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped:
        addr = addr.ipv4_mapped
    return addr.is_loopback


def test_loopback_check_can_fail():
    assert is_loopback_only("127.0.0.1") and is_loopback_only("::ffff:127.0.0.1") and is_loopback_only("::1")
    for host in ("*", "0.0.0.0", "::", "192.0.2.2", "::ffff:192.0.2.2"):
        assert not is_loopback_only(host), host
    assert _hex_addr("0100007F") == "127.0.0.1" and _hex_addr("00000000") == "0.0.0.0"
    assert _hex_addr("0000000000000000FFFF00000100007F") == "::ffff:127.0.0.1"  # /proc/net/tcp6's [::ffff:127.0.0.1]
    assert _hex_addr("00000000000000000000000000000000") == "::"


# ------------------------------------------------------------------ tests


def test_ray_token_file_is_private(cluster):
    token = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    assert stat.S_IMODE(token.stat().st_mode) == 0o600, oct(token.stat().st_mode)


def test_mlflow_secrets_are_private_files_and_never_printed(cluster):
    assert stat.S_IMODE(cluster["dir"].stat().st_mode) == 0o700
    for name in ("mlflow-password", "mlflow-flask-secret", "mlflow-auth.ini"):
        assert stat.S_IMODE((cluster["dir"] / name).stat().st_mode) == 0o600, name
    password = admin_password(cluster)
    assert len(password) >= 32
    assert password not in cluster["up_output"]
    assert f'export MLFLOW_TRACKING_PASSWORD="$(cat {cluster["dir"]}/mlflow-password)"' in cluster["up_output"]


def test_mlflow_rejects_anonymous_requests_but_health_stays_open(cluster):
    assert http_status(PROBE) == 401
    assert http_status(PROBE, "admin", "not-the-password") == 401
    assert http_status(PROBE, "admin", admin_password(cluster)) == 200
    assert http_status(f"{TRACKING}/health") == 200  # ropim's pre-flight check (ropim/tracking/uri.py)


def test_ray_job_submit_pretrain_is_tracked_by_mlflow_server(cluster, monkeypatch):
    ray_bin = Path(sys.executable).with_name("ray")
    # the job gets the MLflow credentials from the Ray head's environment: only the URI is passed here
    cmd = [
        str(ray_bin), "job", "submit", "--address", f"http://127.0.0.1:{PORTS['DASH_PORT']}",
        "--working-dir", str(ROOT), "--runtime-env-json", json.dumps({"env_vars": {"MLFLOW_TRACKING_URI": TRACKING}}),
        "--", sys.executable, "jobs/pretrain.py", "--preset", "digits_demo", "--model.depth", "1", "--epochs", "1",
        "--max_steps_per_epoch", "2", "--global_batch_size", "16", "--num_workers", "0",
        "--run_name", "submitted",
    ]
    proc = subprocess.run(cmd, env={**cluster["env"], "RAY_AUTH_MODE": "token"}, capture_output=True, text=True,
                          timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "succeeded" in proc.stdout + proc.stderr

    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "admin")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", admin_password(cluster))
    client = MlflowClient(tracking_uri=TRACKING, registry_uri=TRACKING)
    exp = client.get_experiment_by_name("ropim-pretrain")
    runs = client.search_runs([exp.experiment_id], filter_string="attributes.run_name = 'submitted'")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    encoder_uri = runs[0].data.tags["ropim.encoder_uri"]
    name, version = encoder_uri.removeprefix("models:/").split("/")
    assert client.get_model_version(name, version).run_id == runs[0].info.run_id


def test_every_listening_socket_is_on_loopback(cluster):
    # after the job: Ray's daemons plus the workers it keeps around
    pids = cluster_pids(cluster["dir"])
    sockets = listening_sockets(pids)
    ports = {port for _, port, _ in sockets}
    for var in ("RAY_PORT", "DASH_PORT", "MLFLOW_PORT", "RAY_CLIENT_PORT", "RAY_DASH_AGENT_PORT"):
        assert int(PORTS[var]) in ports, f"{var} not among the cluster's listening sockets: {sorted(sockets)}"
    exposed = [(host, port, pid) for host, port, pid in sockets if not is_loopback_only(host)]
    assert not exposed, f"listening beyond 127.0.0.1 (address, port, pid): {exposed}"


def test_no_secret_on_any_command_line(cluster):
    secrets = [admin_password(cluster), (cluster["dir"] / "mlflow-flask-secret").read_text().strip()]
    token_file = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    secrets.append(token_file.read_text().strip())
    pids = cluster_pids(cluster["dir"])
    assert len(pids) > 5
    for pid in Path("/proc").iterdir():  # every process on the machine, not only the cluster's
        try:
            cmdline = (pid / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        assert not any(s in cmdline for s in secrets), f"a secret is on the command line of pid {pid.name}"
    # ...while Ray's processes do have the MLflow credentials in their environment (jobs inherit them)
    raylets = [p for p in pids if Path(f"/proc/{p}/comm").read_text().strip() == "raylet"]
    assert raylets
    environ = Path(f"/proc/{raylets[0]}/environ").read_bytes().split(b"\0")
    assert f"MLFLOW_TRACKING_PASSWORD={secrets[0]}".encode() in environ


def test_rotate_mlflow_password(cluster):
    # last: afterwards Ray's processes hold a stale password until the next `up`
    old = admin_password(cluster)
    rot = subprocess.run([*CLUSTER, "rotate-mlflow-password"], env=cluster["env"], timeout=60, capture_output=True,
                         text=True)
    assert rot.returncode == 0, rot.stdout + rot.stderr
    new = admin_password(cluster)
    assert new != old and new not in rot.stdout + rot.stderr
    assert stat.S_IMODE((cluster["dir"] / "mlflow-password").stat().st_mode) == 0o600
    assert http_status(PROBE, "admin", old) == 401
    assert http_status(PROBE, "admin", new) == 200
