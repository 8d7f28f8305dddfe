"""Offline checks of the Kubernetes manifests in ``deploy/k8s`` (``test_k8s.py`` runs them; no cluster needed).

- KubeRay's custom resources (RayCluster, RayJob) against the CRDs' ``openAPIV3Schema`` as KubeRay publishes them
  (``schemas/``), with ``jsonschema``. The Kubernetes extensions are read as the API server reads them: an object
  schema that lists its properties admits no others (what ``kubectl apply``'s strict field validation reports;
  ``x-kubernetes-preserve-unknown-fields`` lifts it), ``nullable`` admits null, ``x-kubernetes-int-or-string`` an
  integer or a string, ``x-kubernetes-list-type: map`` / ``set`` refuse two items with the same keys / two equal items.
  CEL rules (``x-kubernetes-validations``) are not evaluated: a manifest that sets a field carrying one is refused with
  the rule, so that it is checked by hand rather than passed unseen (rules on ``oldSelf`` apply to updates only).
- Core objects (and the pod templates and metadata inside the custom resources) against Kubernetes' own API types:
  the ``kubernetes`` Python client's models, field by field: an unknown field, a wrong type or a missing required
  field is an error (the client's own deserializer would drop the first two silently).
- Who gets in: credentials only from Secrets (``secretKeyRef``, ``envFrom``), never a literal in a manifest, an
  argument or a Ray runtime env; nothing reachable beyond the cluster network (ClusterIP only, no Ingress, no host
  ports or host network).
"""

from __future__ import annotations

import fnmatch
import functools
import gzip
import hashlib
import json
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import jsonschema
import yaml
from kubernetes.client import models

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
DOCKERFILE = K8S / "Dockerfile"
SCHEMAS = Path(__file__).with_name("schemas")
# KubeRay v1.7.0 (schemas/README.md): file, and the git blob id of the file as published
CRDS = {"RayJob": ("ray.io_rayjobs.yaml.gz", "c7d3f081af8cf08c256a8c33a0c3b6ea28b816a0"),
        "RayCluster": ("ray.io_rayclusters.yaml.gz", "ff0be58ada3bd457605eff1f258c16df21e61e21")}
# the core kinds the manifests may hold, and their model in the kubernetes client
CORE_KINDS = {("v1", "Namespace"): "V1Namespace", ("v1", "ServiceAccount"): "V1ServiceAccount",
              ("v1", "ConfigMap"): "V1ConfigMap", ("v1", "Secret"): "V1Secret", ("v1", "Service"): "V1Service",
              ("apps/v1", "Deployment"): "V1Deployment", ("apps/v1", "StatefulSet"): "V1StatefulSet",
              ("networking.k8s.io/v1", "NetworkPolicy"): "V1NetworkPolicy",
              ("networking.k8s.io/v1", "Ingress"): "V1Ingress"}
NOT_MANIFESTS = ("kustomization.yaml",)


@dataclass(frozen=True)
class Doc:
    """One YAML document of a manifest file."""

    file: str
    index: int
    body: dict

    @property
    def kind(self) -> str:
        return self.body.get("kind", "")

    @property
    def name(self) -> str:
        return (self.body.get("metadata") or {}).get("name", "")

    def __str__(self) -> str:
        return f"{self.file}#{self.index} {self.kind}/{self.name}"


def load_docs(folder: Path = K8S) -> list[Doc]:
    """Every document of every manifest (``*.yaml``) in ``folder``; YAML anchors and aliases resolved."""
    docs = []
    for path in sorted(folder.glob("*.yaml")):
        if path.name in NOT_MANIFESTS:
            continue
        for i, body in enumerate(yaml.safe_load_all(path.read_text())):
            if body is not None:
                docs.append(Doc(path.name, i, body))
    return docs


# ------------------------------------------------------------------ KubeRay's CRDs


def git_blob_id(data: bytes) -> str:
    """What ``git hash-object`` prints for a file of these bytes."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@functools.cache
def crd(kind: str) -> dict:
    """The CustomResourceDefinition of ``kind``, after checking that the stored file is the published one."""
    name, blob = CRDS[kind]
    data = gzip.decompress((SCHEMAS / name).read_bytes())
    if git_blob_id(data) != blob:
        raise AssertionError(f"schemas/{name} is not KubeRay's file (git blob {git_blob_id(data)}, expected {blob})")
    return yaml.load(data, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # libyaml: 5x faster on 1.4 MB


def crd_schema(kind: str, version: str) -> dict:
    (found,) = [v for v in crd(kind)["spec"]["versions"] if v["name"] == version]
    return found["schema"]["openAPIV3Schema"]


def to_json_schema(node):
    """A CRD's structural schema as the JSON Schema that checks what the API server checks (module docstring)."""
    if isinstance(node, list):
        return [to_json_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: to_json_schema(v) if k in ("items", "additionalProperties", "anyOf", "allOf", "oneOf", "not") else v
           for k, v in node.items() if k != "nullable"}
    if "properties" in node:
        out["properties"] = {k: to_json_schema(v) for k, v in node["properties"].items()}
    if node.get("x-kubernetes-embedded-resource"):
        out["properties"] = {"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                             "metadata": {"type": "object"}, **out.get("properties", {})}
    if node.get("nullable") and "type" in node:
        out["type"] = [node["type"], "null"]
    if node.get("x-kubernetes-int-or-string") and "anyOf" not in node:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    open_ended = node.get("x-kubernetes-preserve-unknown-fields") or "additionalProperties" in node
    if "properties" in out and not open_ended:
        out["additionalProperties"] = False
    return out


def list_type(validator, value, instance, schema):
    """``x-kubernetes-list-type``: no two items of a ``map`` list with the same keys, nor two equal items of a
    ``set``."""
    if not isinstance(instance, list) or value not in ("map", "set"):
        return
    keys = schema.get("x-kubernetes-list-map-keys", [])
    defaults = {k: schema.get("items", {}).get("properties", {}).get(k, {}).get("default") for k in keys}
    seen = set()
    for item in instance:
        key = (tuple(item.get(k, defaults[k]) for k in keys) if value == "map" and isinstance(item, dict)
               else json.dumps(item, sort_keys=True))
        if key in seen:
            yield jsonschema.ValidationError(f"two items with the same {'/'.join(keys) or 'value'} {key} in a "
                                             f"list of type {value}")
        seen.add(key)


def cel_rules(validator, rules, instance, schema):
    """``x-kubernetes-validations``: refuse a field whose CEL rules this check cannot evaluate (module docstring)."""
    for rule in rules:
        if "oldSelf" not in rule["rule"]:
            yield jsonschema.ValidationError(
                f"this field carries a CEL rule that the offline check does not evaluate ({rule['rule']!r}: "
                f"{rule.get('message', '')}); check it by hand and teach tests/deploy/k8s_manifests.py the rule")


CrdValidator = jsonschema.validators.extend(
    jsonschema.Draft7Validator, {"x-kubernetes-list-type": list_type, "x-kubernetes-validations": cel_rules})


@functools.cache
def crd_validator(kind: str, version: str) -> jsonschema.protocols.Validator:
    return CrdValidator(to_json_schema(crd_schema(kind, version)))


def crd_errors(body: dict) -> list[str]:
    """``path: message`` for each way a RayCluster / RayJob breaks its CRD's schema."""
    group, _, version = body.get("apiVersion", "").rpartition("/")
    if group != "ray.io" or body.get("kind") not in CRDS:
        return [f"not a KubeRay kind this check knows: {body.get('apiVersion')} {body.get('kind')}"]
    errors = crd_validator(body["kind"], version).iter_errors(body)
    return sorted(f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in errors)


# ------------------------------------------------------------------ Kubernetes' own types

SCALARS = {"str": (str,), "int": (int,), "float": (int, float), "bool": (bool,), "datetime": (str,), "date": (str,),
           "object": (object,)}
# quantities ("8", 8, "26Gi") are typed str in the client; the API server takes a number too
QUANTITIES = {("V1ResourceRequirements", "limits"), ("V1ResourceRequirements", "requests"),
              ("V1VolumeResourceRequirements", "limits"), ("V1VolumeResourceRequirements", "requests"),
              ("V1EmptyDirVolumeSource", "size_limit")}
# IntOrString fields (typed object in the client, which also uses object for free-form JSON)
INT_OR_STRING = {("V1HTTPGetAction", "port"), ("V1TCPSocketAction", "port"), ("V1ServicePort", "target_port"),
                 ("V1NetworkPolicyPort", "port"), ("V1RollingUpdateDeployment", "max_surge"),
                 ("V1RollingUpdateDeployment", "max_unavailable"), ("V1RollingUpdateStatefulSetStrategy",
                 "max_unavailable"), ("V1RollingUpdateDaemonSet", "max_surge"),
                 ("V1RollingUpdateDaemonSet", "max_unavailable"), ("V1PodDisruptionBudgetSpec", "min_available"),
                 ("V1PodDisruptionBudgetSpec", "max_unavailable")}


class ModelCheck:
    """Reads a manifest into the kubernetes client's model classes, collecting every unknown field, wrong type and
    missing required field as ``path: message``."""

    def __init__(self):
        self.errors: list[str] = []

    def fail(self, path: str, message: str) -> None:
        self.errors.append(f"{path or '<root>'}: {message}")

    def read(self, data, type_name: str, path: str = "", quantity: bool = False, int_or_string: bool = False):
        if data is None:
            return None
        if int_or_string:
            if not isinstance(data, int | str) or isinstance(data, bool):
                self.fail(path, f"{data!r} is neither an integer nor a string")
            return data
        if m := re.fullmatch(r"list\[(.+)\]", type_name):
            if not isinstance(data, list):
                return self.fail(path, f"expected a list ({type_name}), got {type(data).__name__}")
            return [self.read(x, m[1], f"{path}[{i}]", quantity) for i, x in enumerate(data)]
        if m := re.fullmatch(r"dict[\[(]str, (.+)[\])]", type_name):
            if not isinstance(data, dict):
                return self.fail(path, f"expected a mapping ({type_name}), got {type(data).__name__}")
            return {k: self.read(v, m[1], f"{path}.{k}", quantity) for k, v in data.items()}
        if type_name in SCALARS:
            allowed = (str, int, float) if quantity else SCALARS[type_name]
            bool_for_number = isinstance(data, bool) and not {bool, object} & set(allowed)  # True is an int too
            if not isinstance(data, allowed) or bool_for_number:
                self.fail(path, f"{data!r} is not of type {type_name}")
            return data
        return self.read_model(data, type_name, path)

    def read_model(self, data, type_name: str, path: str):
        klass = getattr(models, type_name)
        if not isinstance(data, dict):
            return self.fail(path, f"expected an object ({type_name}), got {type(data).__name__}")
        attrs = {key: attr for attr, key in klass.attribute_map.items()}
        before = len(self.errors)
        kwargs = {}
        for key, value in data.items():
            where = f"{path}.{key}" if path else key
            if key not in attrs:
                self.fail(where, f"unknown field {key!r} of {type_name}")
                continue
            attr = attrs[key]
            kwargs[attr] = self.read(value, klass.openapi_types[attr], where, (type_name, attr) in QUANTITIES,
                                     (type_name, attr) in INT_OR_STRING)
        if len(self.errors) > before:
            return None
        try:
            return klass(**kwargs)  # the client's own checks: required fields
        except (ValueError, TypeError) as err:
            return self.fail(path, f"{type_name}: {err}")


def model_errors(data, type_name: str, path: str = "") -> list[str]:
    check = ModelCheck()
    check.read(data, type_name, path)
    return check.errors


def core_errors(body: dict) -> list[str]:
    """``path: message`` for each way a core object breaks its Kubernetes API type."""
    type_name = CORE_KINDS.get((body.get("apiVersion"), body.get("kind")))
    if type_name is None:
        return [f"no API type known for {body.get('apiVersion')} {body.get('kind')}: add it to CORE_KINDS"]
    return model_errors(body, type_name)


def ray_cluster_specs(body: dict) -> list[tuple[str, dict]]:
    """(path, RayClusterSpec) of a RayCluster or a RayJob that brings its own cluster."""
    if body.get("kind") == "RayCluster":
        return [("spec", body.get("spec") or {})]
    if body.get("kind") == "RayJob" and (body.get("spec") or {}).get("rayClusterSpec"):
        return [("spec.rayClusterSpec", body["spec"]["rayClusterSpec"])]
    return []


def pod_templates(body: dict) -> list[tuple[str, dict]]:
    """(path, PodTemplateSpec) of every pod template in a manifest document."""
    found = []
    spec = body.get("spec") or {}
    if body.get("kind") in ("Deployment", "StatefulSet", "DaemonSet", "Job", "ReplicaSet") and "template" in spec:
        found.append(("spec.template", spec["template"]))
    for where, cluster in ray_cluster_specs(body):
        found.append((f"{where}.headGroupSpec.template", (cluster.get("headGroupSpec") or {}).get("template") or {}))
        for i, group in enumerate(cluster.get("workerGroupSpecs") or []):
            found.append((f"{where}.workerGroupSpecs[{i}].template", group.get("template") or {}))
    if body.get("kind") == "RayJob" and spec.get("submitterPodTemplate"):
        found.append(("spec.submitterPodTemplate", spec["submitterPodTemplate"]))
    return found


def embedded_errors(body: dict) -> list[str]:
    """A custom resource's metadata and pod templates, against ObjectMeta and PodTemplateSpec (the CRD schemas leave
    metadata open)."""
    errors = model_errors(body.get("metadata") or {}, "V1ObjectMeta", "metadata")
    for path, template in pod_templates(body):
        errors += model_errors(template, "V1PodTemplateSpec", path)
    return errors


def schema_errors(doc: Doc) -> list[str]:
    """Every schema error of one manifest document: KubeRay's CRDs for its kinds, Kubernetes' types for the rest."""
    if doc.body.get("apiVersion", "").startswith("ray.io/"):
        return crd_errors(doc.body) + embedded_errors(doc.body)
    return core_errors(doc.body)


# ------------------------------------------------------------------ who gets in

SECRET_NAME = re.compile(r"PASSWORD|PASSWD|SECRET|TOKEN|CREDENTIAL|ACCESS_KEY|PRIVATE_KEY|API_KEY", re.I)
SECRET_URI = re.compile(r"[a-z][a-z0-9+.-]*://[^\s/@:'\"]+:[^\s/@'\"]+@", re.I)
SECRET_TEXT = re.compile(r"\w*(password|passwd|secret|token)\w*\s*[=:]\s*[^\s$'\"]", re.I)
SECRET_OPTION = re.compile(r"--\S*(password|passwd|secret|token)", re.I)


def strings(node, path: str = ""):
    """(path, value) of every string in a document."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from strings(v, f"{path}.{k}" if path else str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from strings(v, f"{path}[{i}]")
    elif isinstance(node, str):
        yield path, node


def containers(template: dict) -> list[dict]:
    spec = template.get("spec") or {}
    return (spec.get("initContainers") or []) + (spec.get("containers") or [])


def secret_problems(body: dict) -> list[str]:
    """Credentials written into a manifest: a Secret with data, a secret-looking env var given a literal value (or a
    ConfigMap's), credentials in a URI, an option or an assignment in any string (arguments, entrypoints, config
    files), secrets in a Ray runtime env (Ray logs its env_vars)."""
    problems = []
    if body.get("kind") == "Secret" and (body.get("data") or body.get("stringData")):
        problems.append("a Secret with data in a manifest: create it from files with kubectl instead")
    for path, template in pod_templates(body):
        for c in containers(template):
            for env in c.get("env") or []:
                name = env.get("name", "")
                if not SECRET_NAME.search(name):
                    continue
                if "value" in env:
                    problems.append(f"{path} {c.get('name')}: env {name} is a literal; take it from a Secret")
                elif "secretKeyRef" not in (env.get("valueFrom") or {}):
                    problems.append(f"{path} {c.get('name')}: env {name} does not come from a Secret")
    for path, value in strings(body):
        for pattern, what in ((SECRET_URI, "credentials in a URI"), (SECRET_TEXT, "a secret given as a literal"),
                              (SECRET_OPTION, "a secret passed as an option")):
            if m := pattern.search(value):
                problems.append(f"{path}: {what}: {m.group(0)}...")
    runtime_env = yaml.safe_load((body.get("spec") or {}).get("runtimeEnvYAML") or "") or {}
    problems += [f"spec.runtimeEnvYAML: env_vars.{k}: Ray logs runtime envs; give it to the pods from a Secret"
                 for k in (runtime_env.get("env_vars") or {}) if SECRET_NAME.search(k)]
    return problems


EXPOSING_KINDS = ("Ingress", "Gateway", "HTTPRoute", "GRPCRoute", "TCPRoute", "TLSRoute")


def exposure_problems(body: dict) -> list[str]:
    """What would make something reachable from beyond the cluster network."""
    problems = []
    spec = body.get("spec") or {}
    if body.get("kind") in EXPOSING_KINDS:
        problems.append(f"a {body['kind']} exposes services beyond the cluster: use kubectl port-forward")
    if body.get("kind") == "Service":
        if spec.get("type", "ClusterIP") != "ClusterIP":
            problems.append(f"Service type {spec['type']}: only ClusterIP")
        if spec.get("externalIPs"):
            problems.append(f"Service externalIPs {spec['externalIPs']}")
    for where, cluster in ray_cluster_specs(body):
        head = cluster.get("headGroupSpec") or {}
        if head.get("serviceType", "ClusterIP") != "ClusterIP":
            problems.append(f"{where}.headGroupSpec.serviceType {head['serviceType']}: only ClusterIP")
        if head.get("enableIngress"):
            problems.append(f"{where}.headGroupSpec.enableIngress: KubeRay would make an Ingress")
        head_service = (head.get("headService") or {}).get("spec") or {}
        if head_service.get("type", "ClusterIP") != "ClusterIP":
            problems.append(f"{where}.headGroupSpec.headService type {head_service['type']}: only ClusterIP")
    for path, template in pod_templates(body):
        if (template.get("spec") or {}).get("hostNetwork"):
            problems.append(f"{path}: hostNetwork puts the pod's ports on the node's addresses")
        problems += [f"{path} {c.get('name')}: hostPort {p['hostPort']}" for c in containers(template)
                     for p in c.get("ports") or [] if p.get("hostPort")]
    return problems


# ------------------------------------------------------------------ entrypoints, images, versions


def entrypoint_argv(rayjob: dict) -> list[str]:
    """A RayJob's entrypoint as argv: ``python jobs/NAME.py ARGS``."""
    return shlex.split(rayjob["spec"]["entrypoint"])


def print_config(argv: list[str]) -> subprocess.CompletedProcess:
    """Run an entrypoint (``python jobs/NAME.py ...``) from the repository root with ``--print_config``: parses every
    flag with the real CLI, prints the resolved config and starts nothing."""
    python, script, *args = argv
    assert python == "python" and re.fullmatch(r"jobs/\w+\.py", script), f"not a jobs/*.py command: {argv}"
    return subprocess.run([sys.executable, script, *args, "--print_config"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def option(args: list[str], name: str) -> str | None:
    """The value of ``--name V`` or ``--name=V`` in ``args``."""
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def host_allowed(allowed_hosts: str, host: str) -> bool:
    """Would ``mlflow server --allowed-hosts`` accept this Host header (its DNS-rebinding guard: exact names, or
    fnmatch patterns when they hold a ``*``)?"""
    allowed = [h.strip() for h in allowed_hosts.split(",")]
    return "*" in allowed or any(fnmatch.fnmatch(host, a) if "*" in a else host == a for a in allowed)


def dockerfile_base(text: str) -> str:
    """The image a Dockerfile's (last) FROM names, with its ARG defaults filled in."""
    args = dict(re.findall(r"^ARG\s+(\w+)=(\S+)", text, re.M))
    (base, *_) = re.findall(r"^FROM\s+(\S+)", text, re.M)[-1:]
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m[1] or m[2]], base)


def ray_image_versions(image: str) -> tuple[str, str]:
    """(Ray version, Python version) of an official Ray image tag: rayproject/ray:2.60.0-py311-gpu -> 2.60.0, 3.11."""
    m = re.fullmatch(r"rayproject/ray:(\d+\.\d+\.\d+)-py3(\d+)(-\w+)*", image)
    if not m:
        raise ValueError(f"{image}: not an official Ray image with a Ray and a Python version in its tag")
    return m[1], f"3.{m[2]}"


def docker_copied(text: str) -> list[str]:
    """The paths (relative to the build context) a Dockerfile's COPY instructions take."""
    copied = []
    for line in re.findall(r"^COPY\s+(.+)$", text, re.M):
        parts = [p for p in line.split() if not p.startswith("--")]
        copied += parts[:-1]
    return copied
