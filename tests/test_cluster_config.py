"""ray_cluster.yaml: Ray's JSON schema for cluster files, the cross-field rules `ray up` applies, and the things the
file promises — among them who can get in: SSH from one CIDR only, MLflow behind basic auth, no secret on a command
line.

Offline and fast: the schema Ray ships (``ray/autoscaler/ray-schema.json``, a public data file) checks keys and types
without any cloud SDK or network; the rules Ray checks in code (head node type exists, the global ``max_workers``
covers the sum of ``min_workers``) and the per-node-type bounds Ray does not check are ours. Instance types, AMIs and
IAM are not checked.
"""

from __future__ import annotations

import copy
import importlib.resources
import json
import re
import shlex
from pathlib import Path

import jsonschema
import pytest
import yaml

from ropim.cluster.mlflow_auth import auth_config

CLUSTER_FILE = Path(__file__).resolve().parents[1] / "ray_cluster.yaml"
DB_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")
SHELL_OPERATORS = {";", "&", "&&", "||", "|", ">", ">>", "<", "2>&1"}
COMMAND_KEYS = ("initialization_commands", "setup_commands", "head_setup_commands", "worker_setup_commands",
                "head_start_ray_commands", "worker_start_ray_commands")
SSH_PLACEHOLDER = "SSH_ALLOWED_CIDR"
RAY_DEFAULT_GROUP = "ray-autoscaler-{}"  # Ray's name when provider.security_group.GroupName is not set
PASSWORD_FILE = "~/ropim-mlflow-password"


@pytest.fixture(scope="module")
def raw() -> dict:
    return yaml.safe_load(CLUSTER_FILE.read_text())


@pytest.fixture
def cfg(raw) -> dict:
    return copy.deepcopy(raw)


RAY_SCHEMA = json.loads(importlib.resources.files("ray.autoscaler").joinpath("ray-schema.json").read_text())


def ray_validate(cfg: dict) -> dict:
    """What `ray up` checks first: Ray's schema, then that the head node type exists and that the global
    max_workers covers the sum of every node type's min_workers."""
    jsonschema.validate(cfg, RAY_SCHEMA)
    types = cfg["available_node_types"]
    if cfg["head_node_type"] not in types:
        raise ValueError("`head_node_type` must be one of `available_node_types`")
    if cfg.get("max_workers", 0) < sum(t.get("min_workers", 0) for t in types.values()):
        raise ValueError("`max_workers` is smaller than the sum of `min_workers` of all node types")
    return copy.deepcopy(cfg)


def check_cluster_config(cfg: dict) -> dict:
    """Ray's validation plus the per-node-type bounds that Ray itself does not check."""
    prepared = ray_validate(cfg)
    for name, node_type in prepared["available_node_types"].items():
        lo, hi = node_type.get("min_workers", 0), node_type.get("max_workers", 0)
        if not 0 <= lo <= hi:
            raise ValueError(f"node type {name!r}: need 0 <= min_workers ({lo}) <= max_workers ({hi})")
    return prepared


def shell_tokens(command: str) -> list[str]:
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    return list(lexer)


def program_args(command: str, *program: str) -> list[str] | None:
    """Arguments of the first `program ...` invocation in a shell command line, up to the next
    shell operator; None if it is not invoked there."""
    tokens = shell_tokens(command)
    n = len(program)
    for i in range(len(tokens) - n + 1):
        if tuple(tokens[i : i + n]) == program:
            args = []
            for tok in tokens[i + n :]:
                if tok in SHELL_OPERATORS:
                    break
                args.append(tok)
            return args
    return None


def option(args: list[str], name: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def default_of(value: str) -> str:
    """`${VAR:-default}` -> default; anything else unchanged."""
    m = re.fullmatch(r"\$\{\w+:-(.+)\}", value)
    return m.group(1) if m else value


def mlflow_server_args(cfg: dict) -> list[str]:
    found = [a for c in cfg["head_start_ray_commands"] if (a := program_args(c, "mlflow", "server"))]
    assert len(found) == 1, "exactly one `mlflow server` in head_start_ray_commands"
    return found[0]


def all_commands(cfg: dict) -> list[str]:
    """Every shell command of the file: the global lists and the per-node-type ones."""
    commands = [c for key in COMMAND_KEYS for c in cfg.get(key, [])]
    for node_type in cfg["available_node_types"].values():
        commands += [c for key in COMMAND_KEYS for c in node_type.get(key, [])]
    return commands


def header() -> str:
    return CLUSTER_FILE.read_text().split("\ncluster_name:", 1)[0]


def security_group_problems(cfg: dict) -> list[str]:
    """What lets more than SSH from the user's CIDR in through provider.security_group (empty: nothing)."""
    group = cfg["provider"].get("security_group")
    if not group:
        return ["no provider.security_group: Ray's default group allows SSH from 0.0.0.0/0"]
    problems = []
    if group.get("GroupName", RAY_DEFAULT_GROUP.format(cfg["cluster_name"])) == RAY_DEFAULT_GROUP.format(
        cfg["cluster_name"]
    ):
        problems.append("GroupName must be set and not Ray's default (an old group of that name is reused as is)")
    rules = group.get("IpPermissions") or []
    if not rules:
        problems.append("no IpPermissions: SSH would rely on Ray's 0.0.0.0/0 rule")
    for rule in rules:
        if (rule.get("IpProtocol"), rule.get("FromPort"), rule.get("ToPort")) != ("tcp", 22, 22):
            problems.append(f"rule opens more than tcp 22: {rule}")
        for key in ("UserIdGroupPairs", "PrefixListIds"):
            if rule.get(key):
                problems.append(f"rule admits {key}: {rule}")
        cidrs = [r.get("CidrIp") for r in rule.get("IpRanges", [])] + [
            r.get("CidrIpv6") for r in rule.get("Ipv6Ranges", [])
        ]
        if not cidrs:
            problems.append(f"rule names no CIDR: {rule}")
        for cidr in cidrs:
            if cidr != SSH_PLACEHOLDER and (not cidr or cidr.endswith("/0")):
                problems.append(f"SSH open to {cidr}")
    return problems


SECRET_URI = re.compile(r"[a-z][a-z0-9+.-]*://[^\s/@:'\"]+:[^\s/@'\"]+@", re.I)
SECRET_ASSIGNMENT = re.compile(r"\w*(PASSWORD|SECRET_KEY|SECRET|TOKEN)\w*=([^\s;'\"$][^\s;]*|\"[^$\"][^\"]*\")")


def secret_problems(cfg: dict) -> list[str]:
    """Secrets written into a command (so onto a command line, or into this file), and a `mlflow server` that
    takes its store URI as an argument (`ps` shows it, and a database URI carries its password)."""
    problems = []
    for command in all_commands(cfg):
        if m := SECRET_URI.search(command):
            problems.append(f"credentials in a URI: {m.group(0)}...")
        if m := SECRET_ASSIGNMENT.search(command):
            problems.append(f"secret given as a literal: {m.group(0)}")
    args = mlflow_server_args(cfg)
    if option(args, "--backend-store-uri") is not None:
        problems.append("mlflow server --backend-store-uri: pass MLFLOW_BACKEND_STORE_URI through the environment")
    problems += [f"mlflow server option carries a secret: {a}" for a in args if re.match(r"--\S*(password|secret)", a)]
    return problems


def gpu_node_types(cfg: dict) -> dict:
    return {
        name: nt
        for name, nt in cfg["available_node_types"].items()
        if name != cfg["head_node_type"] and nt.get("resources", {}).get("GPU", 0) >= 1
    }


# ------------------------------------------------------------------ Ray's validation


def test_shipped_file_passes_ray_validation(cfg):
    prepared = check_cluster_config(cfg)
    assert prepared["provider"]["type"] == "aws"


def _unknown_key_in_node_type(c):
    c["available_node_types"]["ray.worker.gpu"]["min_worker"] = 0


def _max_workers_below_min_workers(c):
    c["available_node_types"]["ray.worker.gpu"]["min_workers"] = 3
    c["max_workers"] = 2


def _missing_node_config(c):
    del c["available_node_types"]["ray.worker.gpu"]["node_config"]


def _unknown_head_node_type(c):
    c["head_node_type"] = "ray.head.typo"


def _non_integer_gpu_count(c):
    c["available_node_types"]["ray.worker.gpu"]["resources"]["GPU"] = "one"


def _unknown_top_level_key(c):
    c["setup_command"] = c.pop("setup_commands")


@pytest.mark.parametrize(
    ("breakage", "error", "message"),
    [
        (_unknown_key_in_node_type, jsonschema.ValidationError, "'min_worker' was unexpected"),
        (_max_workers_below_min_workers, ValueError, "max_workers` is smaller than the sum of `min_workers"),
        (_missing_node_config, jsonschema.ValidationError, "'node_config' is a required property"),
        (_unknown_head_node_type, ValueError, "`head_node_type` must be one of `available_node_types`"),
        (_non_integer_gpu_count, jsonschema.ValidationError, "'one' is not of type 'integer'"),
        (_unknown_top_level_key, jsonschema.ValidationError, "'setup_command' was unexpected"),
    ],
    ids=lambda v: v.__name__.strip("_") if callable(v) else None,
)
def test_broken_copies_fail_ray_validation(cfg, breakage, error, message):
    breakage(cfg)
    with pytest.raises(error, match=re.escape(message)):
        ray_validate(cfg)


def test_per_node_type_min_above_max_is_caught_by_our_check_not_ray(cfg):
    # Ray only compares the global max_workers with the sum of min_workers; a node type whose
    # own min_workers exceeds its max_workers passes Ray's validation.
    cfg["available_node_types"]["ray.worker.gpu"].update(min_workers=3, max_workers=2)
    ray_validate(cfg)
    with pytest.raises(ValueError, match="min_workers"):
        check_cluster_config(cfg)


# ------------------------------------------------------------------ what the file promises


def test_head_runs_mlflow_for_the_cluster_with_database_store(cfg):
    args = mlflow_server_args(cfg)
    assert option(args, "--host") == "0.0.0.0"  # workers' rank 0 logs to it; the security group keeps it inside
    assert option(args, "--port") == "5000"
    # the store URI reaches `mlflow server` through its environment (it reads MLFLOW_BACKEND_STORE_URI itself)
    (command,) = [c for c in cfg["head_start_ray_commands"] if program_args(c, "mlflow", "server")]
    (store,) = [t.split("=", 1)[1] for t in shell_tokens(command) if t.startswith("MLFLOW_BACKEND_STORE_URI=")]
    store = default_of(store)
    assert store.split(":", 1)[0].split("+", 1)[0] in DB_SCHEMES, store
    artifacts = default_of(option(args, "--artifacts-destination") or "")
    assert artifacts.startswith("s3://"), artifacts


def test_mlflow_server_is_started_in_the_background_and_recorded(cfg):
    (command,) = [c for c in cfg["head_start_ray_commands"] if program_args(c, "mlflow", "server")]
    tokens = shell_tokens(command)
    assert "&" in tokens[tokens.index("mlflow") :], "mlflow server must not block the start commands"
    assert "setsid" in tokens and "nohup" in tokens
    assert "~/mlflow/server.pid" in tokens


def test_bucket_placeholder_is_documented(raw):
    text = CLUSTER_FILE.read_text()
    header = text.split("\ncluster_name:", 1)[0]
    artifacts = default_of(option(mlflow_server_args(raw), "--artifacts-destination"))
    bucket = artifacts.split("/")[2]
    assert "CHANGE-ME" in bucket
    assert bucket in header


def test_head_starts_ray_with_jobs_pointed_at_mlflow(cfg):
    (command,) = [c for c in cfg["head_start_ray_commands"] if program_args(c, "ray", "start")]
    args = program_args(command, "ray", "start")
    assert "--head" in args
    assert option(args, "--port") == "6379"
    assert option(args, "--dashboard-port") == "8265"
    assert option(args, "--autoscaling-config") == "~/ray_bootstrap_config.yaml"
    # the head's private IP, which the GPU workers can reach (127.0.0.1 there would be the worker itself)
    assert re.search(r"MLFLOW_TRACKING_URI=http://\$\(hostname -I \| cut -d' ' -f1\):5000[\s;]", command)


def test_ports_are_documented_in_the_header():
    text = header()
    for port in ("22", "6379", "8265", "5000"):
        assert re.search(rf"^#\s+{port}\s", text, re.M), f"port {port} not documented"
    assert "ray attach ray_cluster.yaml -p 5000" in text
    assert "ray dashboard ray_cluster.yaml" in text


def test_workers_do_not_point_mlflow_at_their_own_loopback(cfg):
    assert not any("MLFLOW_TRACKING_URI" in c for c in cfg["worker_start_ray_commands"])


def test_all_nodes_share_one_auth_token(cfg):
    assert cfg["file_mounts"]["~/.ray/auth_token"] == "~/.ray/auth_token"
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        (command,) = [c for c in cfg[key] if program_args(c, "ray", "start")]
        assert "RAY_AUTH_MODE=token" in shell_tokens(command), key


def test_gpu_worker_group_autoscales_from_zero(cfg):
    gpu = gpu_node_types(cfg)
    assert gpu, "no worker node type with GPU resources"
    for name, nt in gpu.items():
        assert nt["min_workers"] == 0, name
        assert nt["max_workers"] >= 1, name
        assert nt["resources"]["CPU"] >= 1, name
        assert nt["node_config"]["InstanceType"], name
    assert cfg["max_workers"] >= max(nt["max_workers"] for nt in gpu.values())


def test_head_is_cpu_only_and_takes_no_cpu_work(cfg):
    head = cfg["available_node_types"][cfg["head_node_type"]]
    assert head["resources"] == {"CPU": 0}


def test_setup_installs_the_project_on_every_node(cfg):
    assert cfg["file_mounts"]["~/ropim"] == "."
    for key in ("head_setup_commands", "worker_setup_commands"):  # `ray up` runs setup_commands, then these
        installs = [program_args(c, "pip", "install") for c in cfg.get("setup_commands", []) + cfg.get(key, [])]
        assert any(a and a[:2] == ["-e", "~/ropim"] for a in installs), key


# ------------------------------------------------------------------ who can get in


def test_security_group_allows_only_ssh_from_the_users_cidr(cfg):
    assert security_group_problems(cfg) == []
    (rule,) = cfg["provider"]["security_group"]["IpPermissions"]
    assert [r["CidrIp"] for r in rule["IpRanges"]] == [SSH_PLACEHOLDER]  # no default: `ray up` fails until set
    assert SSH_PLACEHOLDER in header() and "0.0.0.0/0" in header()  # documented, and why Ray's rule is removed


def _ssh_from_anywhere(c):
    c["provider"]["security_group"]["IpPermissions"][0]["IpRanges"] = [{"CidrIp": "0.0.0.0/0"}]


def _ssh_from_anywhere_v6(c):
    c["provider"]["security_group"]["IpPermissions"][0]["Ipv6Ranges"] = [{"CidrIpv6": "::/0"}]


def _another_port(c):
    c["provider"]["security_group"]["IpPermissions"].append(
        {"IpProtocol": "tcp", "FromPort": 5000, "ToPort": 5000, "IpRanges": [{"CidrIp": "10.0.0.0/8"}]}
    )


def _port_range_around_ssh(c):
    c["provider"]["security_group"]["IpPermissions"][0]["ToPort"] = 8265


def _all_protocols(c):
    c["provider"]["security_group"]["IpPermissions"][0]["IpProtocol"] = "-1"


def _no_security_group(c):
    del c["provider"]["security_group"]


def _rays_default_group_name(c):
    c["provider"]["security_group"]["GroupName"] = "ray-autoscaler-ropim"


@pytest.mark.parametrize(
    "breakage",
    [_ssh_from_anywhere, _ssh_from_anywhere_v6, _another_port, _port_range_around_ssh, _all_protocols,
     _no_security_group, _rays_default_group_name],
    ids=lambda f: f.__name__.strip("_"),
)
def test_security_group_check_catches(cfg, breakage):
    breakage(cfg)
    ray_validate(cfg)  # all of these are valid cluster files for Ray
    assert security_group_problems(cfg)


def test_head_revokes_the_open_ssh_rule_ray_adds(cfg):
    # Ray 2.60 adds "tcp 22 from 0.0.0.0/0" to every security group it creates, next to our rules
    # (ray/autoscaler/_private/aws/config.py, _create_default_inbound_rules): the head's first command revokes it
    # and fails `ray up` if the group is still open; workers (no instance profile by default) skip it.
    (command,) = cfg["initialization_commands"]
    tokens = shell_tokens(command)
    group = cfg["provider"]["security_group"]["GroupName"]
    assert f"Name=group-name,Values={group}" in tokens
    revoke = program_args(command, "aws", "ec2", "revoke-security-group-ingress")
    assert option(revoke, "--ip-permissions") == "IpProtocol=tcp,FromPort=22,ToPort=22,IpRanges=[{CidrIp=0.0.0.0/0}]"
    assert "exit" in tokens  # ...and stops if it could not
    for name, node_type in cfg["available_node_types"].items():
        if name != cfg["head_node_type"]:
            assert node_type["initialization_commands"] == [], name


def test_mlflow_server_requires_login(cfg):
    args = mlflow_server_args(cfg)
    assert option(args, "--app-name") == "basic-auth"
    (command,) = [c for c in cfg["head_start_ray_commands"] if program_args(c, "mlflow", "server")]
    tokens = shell_tokens(command)
    # the admin password and the CSRF key come from files on the head, through the environment
    assert f"MLFLOW_AUTH_ADMIN_PASSWORD=$(cat {PASSWORD_FILE})" in tokens
    assert "MLFLOW_FLASK_SERVER_SECRET_KEY=$(cat ~/mlflow/flask-secret-key)" in tokens
    assert 'MLFLOW_AUTH_CONFIG_PATH=$HOME/mlflow/basic_auth.ini' in tokens
    # ...and the config there is written by the one copy of the auth setup, the local cluster's
    config = program_args(command, "python", "-m", "ropim.cluster.mlflow_auth", "config")
    assert config[0] == "$HOME/mlflow/basic_auth.ini"
    assert "default_permission = NO_PERMISSIONS" in auth_config(default_of(option(config, "--database-uri")))


def test_no_secret_on_any_command_line(cfg):
    assert secret_problems(cfg) == []


def _store_uri_as_argument(c):
    (i,) = [i for i, cmd in enumerate(c["head_start_ray_commands"]) if program_args(cmd, "mlflow", "server")]
    c["head_start_ray_commands"][i] = c["head_start_ray_commands"][i].replace(
        "mlflow server", 'mlflow server --backend-store-uri "$MLFLOW_BACKEND_STORE_URI"'
    )


def _database_password_in_a_command(c):
    c["head_setup_commands"].append("export MLFLOW_BACKEND_STORE_URI=postgresql://ropim:hunter2@db:5432/mlflow")


FROM_FILE = f'="$(cat {PASSWORD_FILE})"'


def _literal_admin_password(c):
    old, new = f"MLFLOW_AUTH_ADMIN_PASSWORD{FROM_FILE}", "MLFLOW_AUTH_ADMIN_PASSWORD=hunter2hunter2"
    c["head_start_ray_commands"] = [cmd.replace(old, new) for cmd in c["head_start_ray_commands"]]


def _quoted_literal_tracking_password(c):
    old, new = f"MLFLOW_TRACKING_PASSWORD{FROM_FILE}", 'MLFLOW_TRACKING_PASSWORD="hunter2 x"'
    c["worker_start_ray_commands"] = [cmd.replace(old, new) for cmd in c["worker_start_ray_commands"]]


@pytest.mark.parametrize(
    "breakage",
    [_store_uri_as_argument, _database_password_in_a_command, _literal_admin_password,
     _quoted_literal_tracking_password],
    ids=lambda f: f.__name__.strip("_"),
)
def test_secret_check_catches(raw, breakage):
    c = copy.deepcopy(raw)
    breakage(c)
    assert c != raw, "the breakage changed nothing"
    assert secret_problems(c)


def test_every_nodes_ray_processes_get_the_mlflow_credentials_from_a_file(cfg):
    # rank 0 of a Train run logs from a GPU node, so the workers' Ray needs them as much as the head's
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        (command,) = [c for c in cfg[key] if program_args(c, "ray", "start")]
        tokens = shell_tokens(command)
        assert "MLFLOW_TRACKING_USERNAME=admin" in tokens, key
        assert f"MLFLOW_TRACKING_PASSWORD=$(cat {PASSWORD_FILE})" in tokens, key
        assert tokens.index(f"MLFLOW_TRACKING_PASSWORD=$(cat {PASSWORD_FILE})") < tokens.index("ray"), key
    # the head makes the file (0600) unless it is shipped; workers get the head's copy
    assert any(PASSWORD_FILE in c and "umask 077" in c for c in cfg["head_setup_commands"])
    assert PASSWORD_FILE in cfg["cluster_synced_files"]
    assert re.search(rf'^\s*#\s*"{re.escape(PASSWORD_FILE)}":', CLUSTER_FILE.read_text(), re.M)  # optional own file


def test_ray_token_is_private_on_every_node(cfg):
    assert any(program_args(c, "chmod", "600", "~/.ray/auth_token") is not None for c in cfg["setup_commands"])
    assert "umask 077" in header()  # on the laptop too
