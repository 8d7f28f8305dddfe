"""MLflow's basic auth, one copy for every server ropim sets up: the local cluster (``make cluster-up``) and the AWS
head (``ray_cluster.yaml`` runs ``python -m ropim.cluster.mlflow_auth``); deploy/k8s's ConfigMap holds the same
config text (tests/test_cluster_local.py compares them).

- The config (``MLFLOW_AUTH_CONFIG_PATH``): user ``admin``; ``default_permission = NO_PERMISSIONS``, so a user you
  add sees nothing until granted; ``auth_cache_ttl_seconds = 60``: a checked password is remembered for 60 s per
  server worker instead of being hashed again (scrypt, 0.3-1 s of CPU) on every request.
- Secrets (admin password, the app's CSRF key): random, made once, mode 0600, never printed and never on a command
  line; the server gets them through its environment, read from these files by whoever starts it.

    python -m ropim.cluster.mlflow_auth secrets FILE...                      make each secret unless it exists
    python -m ropim.cluster.mlflow_auth config FILE --database-uri URI       write the config
    python -m ropim.cluster.mlflow_auth rotate URI PASSWORD_FILE             new admin password (update-password API)
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import secrets
import sys
import urllib.error
import urllib.request
from pathlib import Path

ADMIN = "admin"
MIN_SECRET_CHARS = 12
PROBE = "/api/2.0/mlflow/experiments/search?max_results=1"  # answers 401 without credentials when auth is on


class AuthError(Exception):
    """A secret or the auth store is not as the server needs it; the message names the file and the fix."""


def auth_config(database_uri: str) -> str:
    """The text of the basic-auth app's config file, its users kept in ``database_uri``."""
    return ("[mlflow]\n"
            "default_permission = NO_PERMISSIONS\n"
            f"database_uri = {database_uri}\n"
            f"admin_username = {ADMIN}\n"
            "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
            "auth_cache_ttl_seconds = 60\n")


def write_private(path: Path, text: str) -> None:
    """Replace ``path`` with ``text``, the file mode 0600 from its first byte."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
        f.write(text)
    os.replace(tmp, path)


def write_config(path: Path, database_uri: str) -> None:
    """Write the basic-auth config (mode 0600) to ``path``."""
    write_private(path, auth_config(database_uri))


def read_secret(path: Path) -> str:
    return path.read_text().strip()


def ensure_secret(path: Path) -> None:
    """A random secret in ``path`` (mode 0600) unless it holds one; one already there (made earlier, or shipped by
    the user) is made 0600 and must have at least ``MIN_SECRET_CHARS`` characters."""
    if path.is_file() and path.stat().st_size:
        path.chmod(0o600)
        if len(read_secret(path)) < MIN_SECRET_CHARS:
            raise AuthError(f"{path} holds a secret under {MIN_SECRET_CHARS} characters; put a longer one there "
                            "or delete the file to have a random one made")
        return
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_private(path, secrets.token_urlsafe(32) + "\n")


def check_admin_password(database_uri: str, password_file: Path) -> None:
    """An auth store that already holds the admin needs the password it was made with (the server only reads
    ``MLFLOW_AUTH_ADMIN_PASSWORD`` when it creates the admin in a new store)."""
    store = Path(database_uri.removeprefix("sqlite:///"))
    has_password = password_file.is_file() and password_file.stat().st_size > 0
    if database_uri.startswith("sqlite:///") and store.exists() and not has_password:
        raise AuthError(f"{store} has an admin user but {password_file} is gone; restore the file, or delete {store} "
                        "to create a new admin (the tracking data is kept)")


def server_env(config: Path, password_file: Path, secret_file: Path) -> dict[str, str]:
    """What ``mlflow server --app-name basic-auth`` needs in its environment (never on its command line)."""
    return {"MLFLOW_AUTH_CONFIG_PATH": str(config), "MLFLOW_AUTH_ADMIN_USERNAME": ADMIN,
            "MLFLOW_AUTH_ADMIN_PASSWORD": read_secret(password_file),
            "MLFLOW_FLASK_SERVER_SECRET_KEY": read_secret(secret_file)}


def http_status(url: str, password: str | None = None, method: str = "GET", body: dict | None = None) -> int:
    """The HTTP status of a request to ``url``, as ``admin`` when a ``password`` is given (0: no answer)."""
    req = urllib.request.Request(url, method=method, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    if password is not None:
        req.add_header("Authorization", "Basic " + base64.b64encode(f"{ADMIN}:{password}".encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:
        return 0


def rotate_password(uri: str, password_file: Path) -> None:
    """A new random admin password through MLflow's update-password API (what ``AuthServiceClient.
    update_user_password`` sends), then written to ``password_file``; the old one stops working at once."""
    old = read_secret(password_file)
    new_file = password_file.with_name(password_file.name + ".new")
    new_file.unlink(missing_ok=True)
    ensure_secret(new_file)
    new = read_secret(new_file)
    status = http_status(f"{uri}/api/2.0/mlflow/users/update-password", old, "PATCH",
                     {"username": ADMIN, "password": new, "current_password": old})
    if status != 200:
        new_file.unlink()
        raise AuthError(f"update-password request failed (HTTP {status}); {password_file} unchanged")
    os.replace(new_file, password_file)
    if http_status(uri + PROBE, new) != 200:
        raise AuthError(f"the new password in {password_file} is not accepted")


def main(argv: list[str] | None = None) -> None:
    """``python -m ropim.cluster.mlflow_auth secrets|config|rotate``: one error line, no traceback."""
    parser = argparse.ArgumentParser(prog="python -m ropim.cluster.mlflow_auth", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("secrets", help="make each secret file unless it exists").add_argument("files", nargs="+",
                                                                                          type=Path)
    config = sub.add_parser("config", help="write the basic-auth config")
    config.add_argument("file", type=Path)
    config.add_argument("--database-uri", required=True, help="where the app keeps its users")
    rotate = sub.add_parser("rotate", help="new admin password")
    rotate.add_argument("uri")
    rotate.add_argument("password_file", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.command == "secrets":
            for path in args.files:
                ensure_secret(path)
        elif args.command == "config":
            write_config(args.file, args.database_uri)
        else:
            rotate_password(args.uri, args.password_file)
    except (AuthError, OSError) as err:
        sys.exit(f"{parser.prog}: error: {err}")


if __name__ == "__main__":
    main()
