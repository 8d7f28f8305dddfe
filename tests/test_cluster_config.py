"""ray_cluster.yaml: Ray's JSON schema for cluster files, the cross-field rules `ray up` applies, and the things the
file promises.

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

CLUSTER_FILE = Path(__file__).resolve().parents[1] / "ray_cluster.yaml"
DB_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")
SHELL_OPERATORS = {";", "&", "&&", "||", "|", ">", ">>", "<", "2>&1"}


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
    store = default_of(option(args, "--backend-store-uri") or "")
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
    assert "MLFLOW_TRACKING_URI=http://$(hostname -I | cut -d' ' -f1):5000;" in command


def test_ports_are_documented_in_the_header():
    header = CLUSTER_FILE.read_text().split("\ncluster_name:", 1)[0]
    for port in ("6379", "8265", "5000"):
        assert re.search(rf"^#\s+{port}\s", header, re.M), f"port {port} not documented"
    assert "ray attach ray_cluster.yaml -p 5000" in header
    assert "ray dashboard ray_cluster.yaml" in header


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
