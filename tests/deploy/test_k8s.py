"""deploy/k8s without a cluster: every manifest against KubeRay's CRD schemas or Kubernetes' own API types, every
RayJob entrypoint through the real CLI (``--print_config``: a renamed flag fails here, not in a user's launch), the
image recipe against pyproject.toml's pins, and who can get in: credentials only from Secrets or the service account,
nothing reachable beyond the cluster network. Each check is also shown to fail on a broken copy.

Fast (seconds): the checks are in ``k8s_manifests.py``; the CRDs are test data in ``schemas/`` (README there).
"""

from __future__ import annotations

import configparser
import copy
import functools
import gzip
import re
import shlex
from urllib.parse import urlsplit

import pytest
import yaml
from k8s_manifests import (
    CRDS,
    DOCKERFILE,
    K8S,
    ROOT,
    SCHEMAS,
    core_errors,
    crd,
    crd_errors,
    docker_copied,
    dockerfile_base,
    embedded_errors,
    entrypoint_argv,
    exposure_problems,
    git_blob_id,
    host_allowed,
    load_docs,
    option,
    pod_templates,
    print_config,
    ray_cluster_specs,
    ray_image_versions,
    schema_errors,
    secret_problems,
)
from packaging.specifiers import SpecifierSet

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest brings tomli
    import tomli as tomllib

DOCS = load_docs()
JOBS = {"ropim-pretrain": "jobs/pretrain.py", "ropim-rho-ablation": "jobs/sweep.py",
        "ropim-finetune": "jobs/finetune.py"}
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def docs_of(kind: str) -> dict[str, dict]:
    return {d.name: d.body for d in DOCS if d.kind == kind}


def one(kind: str, name: str) -> dict:
    return copy.deepcopy(docs_of(kind)[name])


def ray_pin() -> str:
    (pin,) = [m[1] for d in PYPROJECT["project"]["dependencies"] if (m := re.fullmatch(r"ray\[[^\]]*\]==(\S+)", d))]
    return pin


def env_of(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env") or []}


def ray_containers(body: dict) -> list[tuple[str, dict]]:
    """(path, container) of the Ray container (the first) of every head and worker pod of a RayCluster / RayJob."""
    return [(path, t["spec"]["containers"][0]) for path, t in pod_templates(body) if "submitter" not in path]


RAYJOBS = docs_of("RayJob")
MLFLOW = one("Deployment", "ropim-mlflow")
MLFLOW_CONTAINER = MLFLOW["spec"]["template"]["spec"]["containers"][0]


# ------------------------------------------------------------------ the schemas


@pytest.mark.parametrize("kind", sorted(CRDS))
def test_schema_files_are_kuberays_as_published(kind):
    name, blob = CRDS[kind]
    assert git_blob_id(gzip.decompress((SCHEMAS / name).read_bytes())) == blob
    assert crd(kind)["spec"]["names"]["kind"] == kind
    assert name.removesuffix(".gz") in (SCHEMAS / "README.md").read_text() and "Apache" in (
        SCHEMAS / "README.md").read_text()


@pytest.mark.parametrize("doc", DOCS, ids=str)
def test_every_manifest_validates(doc):
    assert schema_errors(doc) == []
    assert doc.body["metadata"].get("namespace", "ropim") == "ropim"
    if doc.kind != "Namespace":
        assert doc.body["metadata"]["namespace"] == "ropim", "every object names its namespace"


def test_the_manifests_hold_what_the_issue_asks():
    kinds = {(d.kind, d.name) for d in DOCS}
    assert {("RayCluster", "ropim"), ("Deployment", "ropim-mlflow"), ("Service", "ropim-mlflow"),
            ("StatefulSet", "ropim-postgres"), ("Service", "ropim-postgres")} <= kinds
    assert set(RAYJOBS) == set(JOBS)
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    for path in kustomization["resources"]:
        assert (K8S / path).is_file(), path
        assert not {d.kind for d in DOCS if d.file == path} & {"RayJob", "RayCluster"}, "apply -k starts no GPU pods"
    readme = (ROOT / "docs" / "kubernetes.md").read_text()  # "Run on Kubernetes" in the docs
    assert len(readme.splitlines()) <= 30
    for needed in ("kubectl apply", "get rayjobs -w", "logs -f", "port-forward svc/ropim-mlflow"):
        assert needed in readme, needed


# ------------------------------------------------------------------ the RayJobs


@pytest.mark.parametrize("name", sorted(JOBS))
def test_rayjob_brings_its_cluster_and_removes_it(name):
    spec = RAYJOBS[name]["spec"]
    assert spec["shutdownAfterJobFinishes"] is True
    assert spec["ttlSecondsAfterFinished"] > 0
    assert spec["rayClusterSpec"]["enableInTreeAutoscaling"] is False
    argv = entrypoint_argv(RAYJOBS[name])
    assert argv[:2] == ["python", JOBS[name]] and (ROOT / JOBS[name]).is_file()
    workdir = re.search(r"^WORKDIR\s+(\S+)", DOCKERFILE.read_text(), re.M)[1]
    assert yaml.safe_load(spec["runtimeEnvYAML"]) == {"working_dir": workdir}  # the image's checkout


@functools.cache
def printed_config(name: str) -> dict:
    """What a RayJob's entrypoint prints with --print_config (once per test run; read only)."""
    proc = print_config(entrypoint_argv(RAYJOBS[name]))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return yaml.safe_load(proc.stdout)


def cluster_fit(cluster: dict, gpus: int, cpus_per_worker: float) -> list[str]:
    """Why ``gpus`` single-GPU Train workers of ``cpus_per_worker`` CPUs would not fit the cluster's worker pods."""
    problems, total = [], 0
    for group in cluster["workerGroupSpecs"]:
        limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
        pods = group["maxReplicas"] if cluster.get("enableInTreeAutoscaling") else group["replicas"]
        total += pods * int(limits.get("nvidia.com/gpu", 0))
        if int(limits.get("nvidia.com/gpu", 0)) and float(limits["cpu"]) < cpus_per_worker:
            problems.append(f"group {group['groupName']}: {limits['cpu']} CPUs per pod < cpus_per_worker")
    if gpus > total:
        problems.append(f"the job asks for {gpus} GPUs, the cluster has {total}")
    return problems


def job_gpus(name: str, printed: dict) -> int:
    return printed["num_workers"] * (printed["max_concurrent"] if JOBS[name] == "jobs/sweep.py" else 1)


@pytest.mark.parametrize("name", sorted(JOBS))
def test_entrypoint_parses_with_the_cli_and_fits_its_cluster(name):
    printed = printed_config(name)
    assert printed["storage_path"].startswith("s3://")  # checkpoints (and Tune's state) on shared storage
    assert printed["data"]["source"].startswith("s3://")
    assert printed["use_gpu"] is True
    assert cluster_fit(RAYJOBS[name]["spec"]["rayClusterSpec"], job_gpus(name, printed),
                       printed["cpus_per_worker"]) == []


def test_the_paper_settings_reach_the_jobs():
    pretrain = printed_config("ropim-pretrain")
    assert (pretrain["model"]["arch"], pretrain["epochs"], pretrain["global_batch_size"]) == (
        "vit_base_patch16_224", 300, 1520)
    sweep = printed_config("ropim-rho-ablation")
    assert sweep["preset_name"] == "rho_ablation" and sweep["space"] == {"rho": {"grid": [0.07, 0.14, 0.25, 0.5]}}
    assert sweep["metric"] == "finetune_top1" and sweep["model"]["arch"] == "vit_tiny_patch16_224"
    finetune = printed_config("ropim-finetune")
    assert finetune["encoder"].startswith("models:/ropim-encoder") and finetune["layer_decay"] == 0.75


def test_entrypoint_configs_validate(monkeypatch):
    """The configs the entrypoints build pass ropim's own checks (batch divisible by the workers, precision, ranges),
    with the built-in digits for the data source: S3 cannot be reached offline."""
    from ropim.cli import job_parser
    from ropim.commands import config
    from ropim.train.finetune.config import FinetuneConfig
    from ropim.train.pretrain.config import PretrainConfig
    from tune.sweep import config_from_args

    monkeypatch.setenv("RAY_ADDRESS", "auto")  # as under `ray job submit`: the workers run on the cluster
    monkeypatch.chdir(ROOT)  # the job's working_dir: the image's checkout
    local = ["--data.source", "digits"]
    for name, cls, command in (("ropim-pretrain", PretrainConfig, "pretrain"),
                               ("ropim-finetune", FinetuneConfig, "finetune")):
        parser = job_parser(cls, command, "test")
        args = parser.parse_args(entrypoint_argv(RAYJOBS[name])[2:] + local)
        assert config(parser.instantiate(args), cls).validate().use_gpu
    sweep = config_from_args(entrypoint_argv(RAYJOBS["ropim-rho-ablation"])[2:] + local).validate()
    PretrainConfig.from_dict(sweep.pretrain).validate()
    FinetuneConfig.from_dict(sweep.trial_finetune(sweep.pretrain)).validate()


def test_a_renamed_flag_fails_the_entrypoint_check():
    job = one("RayJob", "ropim-pretrain")
    job["spec"]["entrypoint"] = job["spec"]["entrypoint"].replace("--storage_path", "--storage_dir")
    proc = print_config(entrypoint_argv(job))
    assert proc.returncode != 0 and "storage_dir" in proc.stderr


def test_a_job_too_big_for_its_cluster_is_caught():
    cluster = RAYJOBS["ropim-pretrain"]["spec"]["rayClusterSpec"]
    assert cluster_fit(cluster, 8, 1.0) == []
    assert cluster_fit(cluster, 16, 1.0) and cluster_fit(cluster, 8, 64.0)


# ------------------------------------------------------------------ one cluster shape, one image, the pinned Ray


def test_every_job_cluster_is_the_standing_clusters_shape():
    standing = docs_of("RayCluster")["ropim"]["spec"]
    for name, job in RAYJOBS.items():
        cluster = job["spec"]["rayClusterSpec"]
        assert cluster["headGroupSpec"] == standing["headGroupSpec"], name
        assert [g["template"] for g in cluster["workerGroupSpecs"]] == [
            g["template"] for g in standing["workerGroupSpecs"]], name
        assert [g["rayStartParams"] for g in cluster["workerGroupSpecs"]] == [
            g["rayStartParams"] for g in standing["workerGroupSpecs"]], name
    for _, cluster in [s for d in DOCS for s in ray_cluster_specs(d.body)]:
        assert cluster["rayVersion"] == ray_pin()
        assert cluster["authOptions"] == {"mode": "token"}  # the Ray token, as everywhere else
        assert cluster["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"  # the head takes no CPU work
        for group in cluster["workerGroupSpecs"]:
            assert int(group["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]) >= 1


def test_one_image_of_this_version_everywhere():
    images = {c["image"] for d in DOCS for path, t in pod_templates(d.body) for c in t["spec"]["containers"]
              if not c["image"].startswith("postgres:")}
    assert len(images) == 1, images
    (image,) = images
    assert image.rpartition(":")[2] == PYPROJECT["project"]["version"]


def dockerfile_problems(text: str) -> list[str]:
    """Where the Dockerfile's base image or contents disagree with pyproject.toml and the RayJobs."""
    problems = []
    ray, python = ray_image_versions(dockerfile_base(text))
    if ray != ray_pin():
        problems.append(f"the image's Ray {ray} is not pyproject.toml's ray=={ray_pin()}")
    if python not in SpecifierSet(PYPROJECT["project"]["requires-python"]):
        problems.append(f"the image's Python {python} is outside requires-python")
    copied = docker_copied(text)
    for name in ("pyproject.toml", *PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]):
        if name.rstrip("*") not in copied:
            problems.append(f"{name} is not copied into the image")
    for job in RAYJOBS.values():  # every file an entrypoint names (the script, --finetune FILE) is in the image
        for arg in entrypoint_argv(job)[1:]:
            if (ROOT / arg).is_file() and arg.split("/")[0] not in copied:
                problems.append(f"{arg} is not copied into the image")
    return problems


def test_dockerfile_is_rays_image_of_the_pinned_versions():
    text = DOCKERFILE.read_text()
    assert dockerfile_base(text) == f"rayproject/ray:{ray_pin()}-py311-gpu"
    assert dockerfile_problems(text) == []
    assert dockerfile_problems(text.replace(f"RAY_VERSION={ray_pin()}", "RAY_VERSION=2.59.0"))
    assert dockerfile_problems(text.replace("PYTHON_TAG=py311", "PYTHON_TAG=py39"))
    assert dockerfile_problems(text.replace("COPY --chown=1000:100 jobs jobs\n", ""))


# ------------------------------------------------------------------ MLflow: PostgreSQL, S3, basic auth


def secret_ref(env: dict) -> tuple[str, str]:
    ref = env["valueFrom"]["secretKeyRef"]
    return ref["name"], ref["key"]


def test_mlflow_server_is_locked_down_like_the_other_clusters():
    args = MLFLOW_CONTAINER["args"]
    assert MLFLOW_CONTAINER["command"] == ["mlflow", "server"]
    assert option(args, "--app-name") == "basic-auth"
    assert option(args, "--backend-store-uri") is None  # the store URI comes through the environment
    assert option(args, "--artifacts-destination").startswith("s3://")
    env = env_of(MLFLOW_CONTAINER)
    postgres = one("StatefulSet", "ropim-postgres")["spec"]["template"]["spec"]["containers"][0]
    db_password = secret_ref(env_of(postgres)["POSTGRES_PASSWORD"])
    assert secret_ref(env["PGPASSWORD"]) == db_password
    assert secret_ref(env["MLFLOW_AUTH_ADMIN_PASSWORD"])[0] == secret_ref(env["MLFLOW_FLASK_SERVER_SECRET_KEY"])[0]
    assert env["MLFLOW_AUTH_ADMIN_USERNAME"]["value"] == "admin"
    assert env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"]["value"] == "false"
    # the auth config: a mounted ConfigMap; NO_PERMISSIONS; its user store in PostgreSQL too
    mounts = {m["name"]: m["mountPath"] for m in MLFLOW_CONTAINER["volumeMounts"]}
    volumes = {v["name"]: v for v in MLFLOW["spec"]["template"]["spec"]["volumes"]}
    (volume,) = [n for n, path in mounts.items() if env["MLFLOW_AUTH_CONFIG_PATH"]["value"].startswith(path + "/")]
    config_map = one("ConfigMap", volumes[volume]["configMap"]["name"])
    ini = configparser.ConfigParser()
    ini.read_string(config_map["data"][env["MLFLOW_AUTH_CONFIG_PATH"]["value"].rpartition("/")[2]])
    assert ini["mlflow"]["default_permission"] == "NO_PERMISSIONS"
    assert ini["mlflow"]["admin_username"] == "admin" and "admin_password" not in ini["mlflow"]
    postgres_service = one("Service", "ropim-postgres")
    for uri in (env["MLFLOW_BACKEND_STORE_URI"]["value"], ini["mlflow"]["database_uri"]):
        parts = urlsplit(uri)
        assert parts.scheme == "postgresql+psycopg", uri  # psycopg 3, installed by the Dockerfile
        assert parts.password is None, "the driver reads PGPASSWORD: no password in a URI"
        assert (parts.hostname, parts.port) == ("ropim-postgres", postgres_service["spec"]["ports"][0]["port"])
    assert MLFLOW_CONTAINER["readinessProbe"]["httpGet"]["path"] == "/health"  # the one page open to anyone


@pytest.mark.parametrize("doc", [d for d in DOCS if d.kind in ("RayCluster", "RayJob")], ids=str)
def test_every_ray_pod_logs_to_the_mlflow_server_with_its_credentials(doc):
    service = one("Service", "ropim-mlflow")
    admin_password = secret_ref(env_of(MLFLOW_CONTAINER)["MLFLOW_AUTH_ADMIN_PASSWORD"])
    for path, container in ray_containers(doc.body):  # rank 0 logs from a GPU pod: workers need them too
        env = env_of(container)
        uri = urlsplit(env["MLFLOW_TRACKING_URI"]["value"])
        assert (uri.scheme, uri.hostname, uri.port) == ("http", service["metadata"]["name"],
                                                         service["spec"]["ports"][0]["port"]), path
        assert host_allowed(option(MLFLOW_CONTAINER["args"], "--allowed-hosts"), uri.netloc), path
        assert env["MLFLOW_TRACKING_USERNAME"]["value"] == "admin", path
        assert secret_ref(env["MLFLOW_TRACKING_PASSWORD"]) == admin_password, path


def test_port_forward_reaches_the_mlflow_ui():
    allowed = option(MLFLOW_CONTAINER["args"], "--allowed-hosts")
    assert host_allowed(allowed, "localhost:5000") and host_allowed(allowed, "127.0.0.1:5000")
    assert not host_allowed(allowed, "evil.example:5000")


# ------------------------------------------------------------------ who gets in


@pytest.mark.parametrize("doc", DOCS, ids=str)
def test_no_credentials_in_any_manifest(doc):
    assert secret_problems(doc.body) == []


@pytest.mark.parametrize("doc", DOCS, ids=str)
def test_nothing_listens_beyond_the_cluster_network(doc):
    assert exposure_problems(doc.body) == []


def _literal_admin_password(docs):
    env = env_of(docs["Deployment"]["spec"]["template"]["spec"]["containers"][0])["MLFLOW_AUTH_ADMIN_PASSWORD"]
    env.pop("valueFrom")
    env["value"] = "hunter2hunter2"


def _literal_tracking_password_in_a_job(docs):
    head = docs["RayJob"]["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    head["env"] = [e for e in head["env"] if e["name"] != "MLFLOW_TRACKING_PASSWORD"] + [
        {"name": "MLFLOW_TRACKING_PASSWORD", "value": "hunter2"}]


def _database_password_in_the_store_uri(docs):
    env = env_of(docs["Deployment"]["spec"]["template"]["spec"]["containers"][0])["MLFLOW_BACKEND_STORE_URI"]
    env["value"] = env["value"].replace("mlflow@", "mlflow:hunter2@")


def _a_secret_with_data(docs):
    docs["Secret"] = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "ropim-mlflow", "namespace": "ropim"},
                      "stringData": {"admin-password": "hunter2hunter2"}}


def _s3_keys_in_the_entrypoint(docs):
    spec = docs["RayJob"]["spec"]
    spec["entrypoint"] = spec["entrypoint"].replace("s3://CHANGE-ME-ropim-data", "s3://AKIAEXAMPLE:wJalrXUt@ropim-data")


def _password_option_in_the_server_args(docs):
    docs["Deployment"]["spec"]["template"]["spec"]["containers"][0]["args"].append("--admin-password=hunter2")


def _password_in_the_auth_config(docs):
    docs["ConfigMap"]["data"]["basic_auth.ini"] += "admin_password = hunter2hunter2\n"


def _secret_in_the_runtime_env(docs):
    docs["RayJob"]["spec"]["runtimeEnvYAML"] += "env_vars:\n  AWS_SECRET_ACCESS_KEY: $AWS_SECRET_ACCESS_KEY\n"


def _aws_key_from_a_config_map(docs):
    worker = docs["RayJob"]["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    worker["env"] = worker["env"] + [{"name": "AWS_SECRET_ACCESS_KEY",
                                      "valueFrom": {"configMapKeyRef": {"name": "aws", "key": "secret"}}}]


def broken_copies(breakage) -> tuple[dict, dict]:
    docs = {"Deployment": one("Deployment", "ropim-mlflow"), "RayJob": one("RayJob", "ropim-pretrain"),
            "ConfigMap": one("ConfigMap", "ropim-mlflow-auth")}
    before = copy.deepcopy(docs)
    breakage(docs)
    assert docs != before, "the breakage changed nothing"
    return before, docs


@pytest.mark.parametrize(
    "breakage",
    [_literal_admin_password, _literal_tracking_password_in_a_job, _database_password_in_the_store_uri,
     _a_secret_with_data, _s3_keys_in_the_entrypoint, _password_option_in_the_server_args,
     _password_in_the_auth_config, _secret_in_the_runtime_env, _aws_key_from_a_config_map],
    ids=lambda f: f.__name__.strip("_"),
)
def test_the_credential_check_catches(breakage):
    before, after = broken_copies(breakage)
    assert all(secret_problems(body) == [] for body in before.values())
    assert any(secret_problems(body) for body in after.values())
    assert all(schema_errors_of(body) == [] for body in after.values())  # valid manifests: only our check says no


def schema_errors_of(body: dict) -> list[str]:
    if body["apiVersion"].startswith("ray.io/"):
        return crd_errors(body) + embedded_errors(body)
    return core_errors(body)


def _load_balancer(docs):
    docs["Service"]["spec"]["type"] = "LoadBalancer"


def _node_port(docs):
    docs["Service"]["spec"]["type"] = "NodePort"
    docs["Service"]["spec"]["ports"][0]["nodePort"] = 30500


def _external_ip(docs):
    docs["Service"]["spec"]["externalIPs"] = ["203.0.113.7"]


def _head_node_port(docs):
    docs["RayJob"]["spec"]["rayClusterSpec"]["headGroupSpec"]["serviceType"] = "NodePort"


def _head_ingress(docs):
    docs["RayCluster"]["spec"]["headGroupSpec"]["enableIngress"] = True


def _host_port(docs):
    docs["Deployment"]["spec"]["template"]["spec"]["containers"][0]["ports"][0]["hostPort"] = 5000


def _host_network(docs):
    docs["RayCluster"]["spec"]["workerGroupSpecs"][0]["template"]["spec"]["hostNetwork"] = True


def _an_ingress(docs):
    docs["Ingress"] = {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
                       "metadata": {"name": "ropim-mlflow", "namespace": "ropim"},
                       "spec": {"defaultBackend": {"service": {"name": "ropim-mlflow", "port": {"number": 5000}}}}}


@pytest.mark.parametrize(
    "breakage",
    [_load_balancer, _node_port, _external_ip, _head_node_port, _head_ingress, _host_port, _host_network, _an_ingress],
    ids=lambda f: f.__name__.strip("_"),
)
def test_the_exposure_check_catches(breakage):
    docs = {"Service": one("Service", "ropim-mlflow"), "Deployment": one("Deployment", "ropim-mlflow"),
            "RayJob": one("RayJob", "ropim-pretrain"), "RayCluster": one("RayCluster", "ropim")}
    assert all(exposure_problems(body) == [] for body in docs.values())
    breakage(docs)
    assert any(exposure_problems(body) for body in docs.values())
    assert all(schema_errors_of(body) == [] for body in docs.values())  # valid manifests: only our check says no


# ------------------------------------------------------------------ the schema checks can fail


def _rayjob_field_typo(job):
    job["spec"]["shutdownAfterJobFinish"] = job["spec"].pop("shutdownAfterJobFinishes")


def _rayjob_ttl_as_text(job):
    job["spec"]["ttlSecondsAfterFinished"] = "600"


def _worker_group_without_name(job):
    del job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["groupName"]


def _container_field_typo(job):
    head = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    head["resource"] = head.pop("resources")


def _env_var_twice(job):
    head = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    head["env"] = head["env"] + [{"name": "MLFLOW_TRACKING_URI", "value": "http://elsewhere:5000"}]


def _unknown_auth_mode(job):
    job["spec"]["rayClusterSpec"]["authOptions"]["mode"] = "password"


def _field_with_an_unchecked_cel_rule(job):
    job["spec"]["rayClusterSpec"]["managedBy"] = "someone-else"


def _metadata_field_typo(job):
    job["metadata"]["label"] = job["metadata"].pop("labels")


@pytest.mark.parametrize(
    "breakage",
    [_rayjob_field_typo, _rayjob_ttl_as_text, _worker_group_without_name, _container_field_typo, _env_var_twice,
     _unknown_auth_mode, _field_with_an_unchecked_cel_rule, _metadata_field_typo],
    ids=lambda f: f.__name__.strip("_"),
)
def test_the_crd_check_catches(breakage):
    job = one("RayJob", "ropim-pretrain")
    breakage(job)
    assert crd_errors(job) + embedded_errors(job)


def _deployment_field_typo(d):
    d["spec"]["replica"] = d["spec"].pop("replicas")


def _replicas_as_text(d):
    d["spec"]["replicas"] = "1"


def _container_without_name(d):
    del d["spec"]["template"]["spec"]["containers"][0]["name"]


def _env_value_as_number(d):
    env = d["spec"]["template"]["spec"]["containers"][0]["env"]
    env[:] = [{"name": "WORKERS", "value": 2}, *env]


def _probe_port_as_list(d):
    d["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["port"] = [5000]


@pytest.mark.parametrize(
    "breakage",
    [_deployment_field_typo, _replicas_as_text, _container_without_name, _env_value_as_number, _probe_port_as_list],
    ids=lambda f: f.__name__.strip("_"),
)
def test_the_kubernetes_type_check_catches(breakage):
    deployment = one("Deployment", "ropim-mlflow")
    assert core_errors(deployment) == []
    breakage(deployment)
    assert core_errors(deployment)


def test_quantities_may_be_numbers_or_text():
    deployment = one("Deployment", "ropim-mlflow")
    deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] = 1
    assert core_errors(deployment) == []


def test_every_entrypoint_is_one_shell_word_list():
    # KubeRay pastes the entrypoint into the submitter's shell command: no shell syntax beyond words
    for job in RAYJOBS.values():
        assert not re.search(r"[;&|<>`$(){}\\]", job["spec"]["entrypoint"])
        assert shlex.join(entrypoint_argv(job)) == job["spec"]["entrypoint"]
