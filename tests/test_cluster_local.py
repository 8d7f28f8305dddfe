"""`make cluster-up`'s pieces without servers: the MLflow auth setup (one copy for the local cluster, ray_cluster.yaml
and deploy/k8s), and which processes count as the cluster's. The cluster itself: tests/cluster/test_cluster_job.py."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from ropim.cluster import mlflow_auth
from ropim.cluster.local import Settings
from ropim.cluster.processes import Service, stop

ROOT = Path(__file__).resolve().parents[1]
SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]
PARENT = [sys.executable, "-c", "import subprocess, time; subprocess.Popen(['sleep', '60']); time.sleep(60)"]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_secrets_are_private_random_and_made_once(tmp_path):
    password = tmp_path / "private" / "mlflow-password"
    mlflow_auth.main(["secrets", str(password), str(tmp_path / "flask-secret")])
    first = password.read_text()
    assert mode(password) == 0o600 and mode(password.parent) == 0o700 and mode(tmp_path / "flask-secret") == 0o600
    assert len(first.strip()) >= 32 and first != (tmp_path / "flask-secret").read_text()
    password.chmod(0o644)  # e.g. shipped by the user
    mlflow_auth.ensure_secret(password)
    assert password.read_text() == first and mode(password) == 0o600


def test_short_shipped_secret_is_refused(tmp_path):
    shipped = tmp_path / "mlflow-password"
    shipped.write_text("hunter2\n")
    with pytest.raises(SystemExit, match="under 12 characters"):
        mlflow_auth.main(["secrets", str(shipped)])


def test_a_ray_token_at_its_own_path_is_made_private_there(tmp_path, monkeypatch):
    """``RAY_AUTH_TOKEN_PATH`` naming a file not made yet: before, `ray get-auth-token --generate` wrote
    ``~/.ray/auth_token`` instead and cluster-up stopped with "no Ray token file"."""
    from ropim.cluster.local import ensure_ray_token

    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    s = Settings.from_env({"CLUSTER_DIR": str(tmp_path), "RAY_AUTH_TOKEN_PATH": str(tmp_path / "ray" / "token")})
    ensure_ray_token(s)
    token = s.token_file.read_text()
    assert mode(s.token_file) == 0o600 and mode(s.token_file.parent) == 0o700 and len(token.strip()) >= 32
    s.token_file.chmod(0o644)  # one ray.init made earlier
    ensure_ray_token(s)
    assert s.token_file.read_text() == token and mode(s.token_file) == 0o600  # kept: running clusters use it


def test_config_is_private_and_the_same_as_deploy_k8s(tmp_path):
    path = tmp_path / "basic_auth.ini"
    mlflow_auth.main(["config", str(path), "--database-uri", "sqlite:////x/auth.db"])
    assert mode(path) == 0o600
    assert path.read_text() == mlflow_auth.auth_config("sqlite:////x/auth.db")
    assert "default_permission = NO_PERMISSIONS\n" in path.read_text()
    k8s = [d for d in yaml.safe_load_all((ROOT / "deploy" / "k8s" / "mlflow.yaml").read_text())
           if d and d["kind"] == "ConfigMap" and "basic_auth.ini" in d["data"]]
    (ini,) = [d["data"]["basic_auth.ini"] for d in k8s]
    uri = next(line.split(" = ", 1)[1] for line in ini.splitlines() if line.startswith("database_uri"))
    assert ini == mlflow_auth.auth_config(uri)


def test_an_auth_store_without_its_password_is_refused(tmp_path):
    store, password = tmp_path / "auth.db", tmp_path / "mlflow-password"
    mlflow_auth.check_admin_password(f"sqlite:///{store}", password)  # a new store: the admin is made from the file
    store.write_bytes(b"")
    with pytest.raises(mlflow_auth.AuthError, match="has an admin user but .* is gone"):
        mlflow_auth.check_admin_password(f"sqlite:///{store}", password)
    password.write_text("x" * 40)
    mlflow_auth.check_admin_password(f"sqlite:///{store}", password)


def test_settings_from_the_environment(tmp_path):
    s = Settings.from_env({"CLUSTER_DIR": str(tmp_path), "MLFLOW_PORT": "5011"})
    assert s.ports["MLFLOW_PORT"] == 5011 and s.ports["RAY_PORT"] == 6380
    assert s.temp_dir == tmp_path / "ray" and s.password_file == tmp_path / "mlflow-password"
    assert s.bin == Path(sys.executable).parent


def test_a_started_session_is_ours_with_its_children_until_stopped(tmp_path):
    service = Service("svc", tmp_path, (tmp_path,))
    proc = service.start(PARENT, tmp_path / "svc.log", dict(os.environ))
    try:
        deadline = time.time() + 10
        while len(service.processes()) < 2 and time.time() < deadline:  # the parent and its `sleep` child
            time.sleep(0.05)
        assert service.alive_sid() == proc.pid == os.getsid(proc.pid)
        ours = service.processes()
        assert {p.pid for p in ours} >= {proc.pid} and len(ours) == 2 and os.getpid() not in {p.pid for p in ours}
    finally:
        stop(service.processes(), 5, print)
    proc.wait(5)
    assert service.alive_sid() is None and service.processes() == []


def test_a_recorded_session_that_is_not_ours_is_ignored(tmp_path):
    # a recycled session id: alive, but no member was recorded by us or names our directories
    service = Service("svc", tmp_path, (tmp_path,))
    service.sid_file.write_text(f"{os.getsid(0)}\n")
    service.snapshot_file.write_text("1 0.00\n")
    assert service.alive_sid() is None and service.processes() == []


def test_processes_with_a_flag_into_the_temp_dir_are_ours(tmp_path):
    temp = tmp_path / "ray"
    service = Service("ray", tmp_path, (tmp_path,), temp)
    flagged = subprocess.Popen([*SLEEPER, f"--temp-dir={temp}"], start_new_session=True)
    bare = subprocess.Popen([*SLEEPER, f"{temp}/session_latest/logs/raylet.out"], start_new_session=True)
    try:
        found = {p.pid for p in service.in_temp_dir()}
        assert flagged.pid in found and bare.pid not in found
    finally:
        for p in (flagged, bare):
            p.kill()
            p.wait(5)
