"""``python -m ropim.cluster up|down|status|rotate-mlflow-password`` (``make cluster-up``, ``cluster-down``,
``cluster-status``): a Ray head for ``ray job submit`` and an MLflow tracking server, on this machine only.

- ``up``: start both, wait until both answer, check MLflow's auth; print the addresses and the shell exports.
- ``status``: what runs, with pids and health (exit 0 healthy, 1 unhealthy, 3 not running).
- ``down``: stop exactly the processes ``up`` started (never ``ray stop``; ``ropim.cluster.processes``).
- ``rotate-mlflow-password``: a new random MLflow admin password in ``$CLUSTER_DIR/mlflow-password``; restart
  (down, up) so that Ray's processes get it.

Locked down: every port on 127.0.0.1 (``ropim.cluster.local``), Ray token auth (``~/.ray/auth_token``, 0600), MLflow
basic auth (``ropim.cluster.mlflow_auth``); ``$CLUSTER_DIR`` is 0700, its secrets 0600, and no secret is ever on a
command line or printed. Settings come from the environment (``ropim.cluster.local.Settings``).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time

from ropim.cluster import mlflow_auth
from ropim.cluster.local import (
    RAY_LISTEN,
    ClusterError,
    Settings,
    key_pids,
    mlflow_auth_status,
    mlflow_healthy,
    port_busy,
    prepare_mlflow_auth,
    ray_healthy,
    say,
    start_mlflow,
    start_ray,
    stop_mlflow,
    stop_ray,
    tail,
)
from ropim.cluster.processes import Service, members


def exports(s: Settings) -> str:
    """The addresses, and the exports a shell needs to submit jobs and read MLflow (the password as a file read)."""
    p = s.ports
    return f"""
Ray GCS        127.0.0.1:{p['RAY_PORT']}  (every Ray port on 127.0.0.1 only; token auth: {s.token_file})
Ray dashboard  http://127.0.0.1:{p['DASH_PORT']}  (also the job submission API)
MLflow         {s.mlflow_uri}  (basic auth, user {mlflow_auth.ADMIN}; store: {s.path('mlflow.db')}, \
artifacts: {s.path('mlartifacts')})
Jobs submitted here already see MLFLOW_TRACKING_URI={s.mlflow_uri} and the MLflow credentials.

export RAY_ADDRESS=http://127.0.0.1:{p['DASH_PORT']}
export MLFLOW_TRACKING_URI={s.mlflow_uri}
export RAY_AUTH_MODE=token
export MLFLOW_TRACKING_USERNAME={mlflow_auth.ADMIN}
export MLFLOW_TRACKING_PASSWORD="$(cat {s.password_file})"
# only for clients that talk to the GCS directly (ray status, ray.init(address=...)):
# export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
"""


def check_programs(s: Settings) -> None:
    if not ((s.bin / "ray").exists() and (s.bin / "mlflow").exists()):
        raise ClusterError(f"no ray/mlflow beside {sys.executable}; run this with the project's virtualenv "
                           "(`make cluster-up` makes it)")
    if importlib.util.find_spec("flask_wtf") is None:
        raise ClusterError(f"MLflow's basic-auth app needs the auth extra: {s.bin}/pip install 'mlflow[auth]>=3.17,<4'")


def check_ports(s: Settings, names: tuple[str, ...]) -> None:
    """Fail before anything starts when a port we need is taken by another process."""
    for name in names:
        if port_busy(s.ports[name]):
            raise ClusterError(f"port {s.ports[name]} ({name}) is already in use by another process; pick another: "
                               f"{name}=<port> make cluster-up")


def wait_healthy(name: str, healthy, service: Service, s: Settings, t0: float) -> bool:
    """Poll ``healthy(s)`` each second until it holds, the deadline passes, or the service's processes are gone."""
    while not healthy(s):
        if time.time() >= t0 + s.up_timeout:
            return False
        if service.alive_sid() is None:
            say(f"{name} exited during startup")
            return False
        time.sleep(1)
    say(f"{name} healthy after {time.time() - t0:.0f}s")
    return True


def up(s: Settings) -> None:
    check_programs(s)
    s.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    s.folder.chmod(0o700)
    t0 = time.time()
    ray_running, mlflow_running = s.ray.alive_sid() is not None, s.mlflow.alive_sid() is not None
    if ray_running and mlflow_running:
        say("already up")
        sys.stdout.write(exports(s))
        return
    if not ray_running:
        stop_ray(s)  # stale records, leftovers of a half-failed start of ours
        check_ports(s, RAY_LISTEN)
    if not mlflow_running:
        stop_mlflow(s)
        check_ports(s, ("MLFLOW_PORT",))
    prepare_mlflow_auth(s)
    if not mlflow_running:  # first: it warms up while `ray start` runs
        start_mlflow(s)
    if not ray_running:
        start_ray(s, t0)
    for name, healthy, service, log in (("ray", ray_healthy, s.ray, "ray-start.log"),
                                        ("mlflow", mlflow_healthy, s.mlflow, "mlflow.log")):
        if not wait_healthy(name, healthy, service, s, t0):
            sys.stderr.write(tail(s.path(log)))
            stop_ray(s)
            stop_mlflow(s)
            raise ClusterError(f"{name} did not become healthy (timeout {s.up_timeout:g}s); stopped what was started "
                               f"(logs in {s.folder})")
    anonymous, admin = mlflow_auth_status(s)
    if anonymous != 401 or admin != 200:
        stop_ray(s)
        stop_mlflow(s)
        raise ClusterError(f"mlflow auth check failed: anonymous request -> HTTP {anonymous} (want 401), admin -> HTTP "
                           f"{admin} (want 200); if the admin password in {s.password_file} was changed by hand, put "
                           f"the old one back or delete {s.path('mlflow-auth.db')}. Stopped what was started (log: "
                           f"{s.path('mlflow.log')})")
    say(f"mlflow auth: anonymous -> {anonymous}, admin -> {admin}")
    s.ray.snapshot()  # now with the dashboard's children and workers
    s.mlflow.snapshot()  # now with uvicorn
    say(f"up in {time.time() - t0:.0f}s")
    sys.stdout.write(exports(s))


def down(s: Settings) -> None:
    t0 = time.time()
    if s.ray.alive_sid() is None and s.mlflow.alive_sid() is None and not s.ray.in_temp_dir():
        s.ray.forget()
        s.mlflow.forget()
        say("not up")
        return
    stop_ray(s)
    stop_mlflow(s)
    if left := s.ray.in_temp_dir():
        raise ClusterError(f"processes still running after down: {' '.join(str(p.pid) for p in left)}")
    say(f"down in {time.time() - t0:.0f}s")


def status(s: Settings) -> int:
    """Print what runs; 0 healthy, 1 unhealthy, 3 not running."""
    rc = 0
    if (sid := s.ray.alive_sid()) is not None:
        print(f"ray:    running (session {sid}, {len(members(sid))} processes; {key_pids(s)})")
        if ray_healthy(s):
            print(f"        healthy: gcs 127.0.0.1:{s.ports['RAY_PORT']}, dashboard "
                  f"http://127.0.0.1:{s.ports['DASH_PORT']}")
        else:
            print(f"        NOT healthy (log: {s.path('ray-start.log')})")
            rc = 1
    else:
        print("ray:    not running")
        rc = 3
    if (sid := s.mlflow.alive_sid()) is not None:
        print(f"mlflow: running (session {sid}, {len(members(sid))} processes)")
        if mlflow_healthy(s):
            anonymous, admin = mlflow_auth_status(s)
            print(f"        healthy: {s.mlflow_uri} (anonymous -> HTTP {anonymous}, admin -> HTTP {admin})")
        else:
            print(f"        NOT healthy (log: {s.path('mlflow.log')})")
            rc = 1
    else:
        print("mlflow: not running")
        rc = 3
    if rc == 0:
        sys.stdout.write(exports(s))
    return rc


def rotate_mlflow_password(s: Settings) -> None:
    """MLflow's update-password API with a new random password (``mlflow_auth.rotate_password``)."""
    if s.mlflow.alive_sid() is None or not mlflow_healthy(s):
        raise ClusterError("mlflow is not up")
    if not s.password_file.is_file():
        raise ClusterError(f"no {s.password_file}")
    mlflow_auth.rotate_password(s.mlflow_uri, s.password_file)
    say(f"new MLflow admin password in {s.password_file} (the old one no longer works)")
    say("Ray's processes still hold the old one: restart for jobs (make cluster-down; make cluster-up),")
    say(f'and re-export MLFLOW_TRACKING_PASSWORD="$(cat {s.password_file})" in your shells')


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m ropim.cluster", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=("up", "down", "status", "rotate-mlflow-password"))
    command = parser.parse_args(argv).command
    s = Settings.from_env()
    try:
        if command == "status":
            sys.exit(status(s))
        {"up": up, "down": down, "rotate-mlflow-password": rotate_mlflow_password}[command](s)
    except (ClusterError, mlflow_auth.AuthError, OSError) as err:
        sys.exit(f"cluster: error: {err}")


if __name__ == "__main__":
    main()
