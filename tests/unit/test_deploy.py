"""The deployment files: the Dockerfile's essentials and the Kubernetes manifests under deploy/.

No Docker daemon and no cluster: the manifests are checked offline against the Kubernetes JSON schemas that
kubernetes-validate bundles (strict: unknown fields are errors), and against the server itself: the ports in
serving_server.py's flags, the routes of the RESTful app, and the drain time that --grace sets.
"""

import ast
import os
import re
import shutil
import subprocess

import kubernetes_validate
import pytest
import yaml

from mindspore_serving.frontends.restful_server import build_docs_app

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEPLOY = os.path.join(ROOT, "deploy")
# the oldest Kubernetes the manifests are meant for (autoscaling/v2 and startup probes are GA long before)
KUBERNETES_VERSION = "1.30.0"
DRAIN_MARGIN_S = 5  # docs/serving.md, Stopping: every process is gone within grace + 5 s
# the page that tells how to run the image and apply the manifests
DEPLOY_DOC = ("docs", "operations", "docker-kubernetes.md")


def _read(*parts):
    with open(os.path.join(ROOT, *parts), encoding="utf-8") as f:
        return f.read()


def _kustomize_resources():
    kustomization = yaml.safe_load(_read("deploy", "kustomization.yaml"))
    docs = []
    for name in kustomization["resources"]:
        docs.extend(d for d in yaml.safe_load_all(_read("deploy", name)) if d)
    return docs


def _one(kind):
    found = [d for d in _kustomize_resources() if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind} in deploy/, found {len(found)}"
    return found[0]


def _container():
    containers = _one("Deployment")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def _flags(args):
    """--name value pairs of a serving_server.py command line."""
    assert len(args) % 2 == 0, args
    return {args[i]: args[i + 1] for i in range(0, len(args), 2)}


def _server_defaults():
    """serving_server.py's flags and their defaults, read from the add_argument calls of the module that defines
    them (importing it would need MindSpore); the removed flags it refuses are not among them."""
    defaults = {}
    for node in ast.walk(ast.parse(_read("mindspore_serving", "cli", "serve.py"))):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
            if not isinstance(node.args[0], ast.Constant):  # the removed flags, refused by name
                continue
            flag = node.args[0].value
            default = next((k.value for k in node.keywords if k.arg == "default"), None)
            defaults[flag] = default.value if isinstance(default, ast.Constant) else None
    return defaults


def _port_of(address):
    host, port = address.rsplit(":", 1)
    return host, int(port)


# --- Dockerfile ---------------------------------------------------------------------------------------------


def _dockerfile_instructions():
    """(INSTRUCTION, argument) pairs, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", _read("Dockerfile"))
    instructions = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            instructions.append((word.upper(), rest.strip()))
    return instructions


def _exec_form(argument):
    value = yaml.safe_load(argument)  # a JSON array is YAML too
    assert isinstance(value, list), f"use the exec form (a JSON array), not {argument!r}"
    return value


def test_dockerfile_base_image_is_slim_python_3_11():
    froms = [arg for word, arg in _dockerfile_instructions() if word == "FROM"]
    assert froms == ["python:3.11-slim"]


def test_dockerfile_installs_pinned_requirements_and_exports_models_at_build():
    runs = [arg for word, arg in _dockerfile_instructions() if word == "RUN"]
    assert any("pip install -r requirements.txt" in r for r in runs)
    export = [r for r in runs if "make models" in r]
    assert export, "the models must be exported when the image is built"
    # MindSpore writes most graphs as 0400: the non-root user must still be able to read them
    assert "chmod -R a+rX servables" in export[0].split("make models", 1)[1]


def test_dockerfile_runs_serving_server_as_non_root_on_all_interfaces():
    instructions = _dockerfile_instructions()
    users = [arg for word, arg in instructions if word == "USER"]
    assert users and users[-1] not in ("root", "0"), "the last USER must not be root"
    entrypoint = _exec_form([arg for word, arg in instructions if word == "ENTRYPOINT"][-1])
    assert entrypoint[-2:] == ["python", "serving_server.py"]
    flags = _flags(_exec_form([arg for word, arg in instructions if word == "CMD"][-1]))
    assert set(flags) <= set(_server_defaults()), f"flags serving_server.py does not take: {flags}"
    exposed = {int(p) for word, arg in instructions if word == "EXPOSE" for p in arg.split()}
    for flag in ("--grpc", "--rest"):
        host, port = _port_of(flags[flag])
        assert host == "0.0.0.0", f"{flag} {flags[flag]} is unreachable from outside the container"
        assert port == _port_of(_server_defaults()[flag])[1] and port in exposed


def test_dockerignore_keeps_local_state_and_exported_models_out():
    patterns = {
        line.strip() for line in _read(".dockerignore").splitlines() if line.strip() and not line.startswith("#")
    }
    assert {".venv", "serving_logs", "bench/results", ".git"} <= patterns
    # every exported-model pattern of .gitignore, so that the image exports its own
    model_patterns = {
        line.strip().rstrip("/") for line in _read(".gitignore").splitlines() if line.startswith("servables/")
    }
    assert model_patterns and model_patterns <= patterns, model_patterns - patterns


# --- Kubernetes manifests -----------------------------------------------------------------------------------


def test_kustomization_lists_every_manifest():
    kustomization = yaml.safe_load(_read("deploy", "kustomization.yaml"))
    manifests = {f for f in os.listdir(DEPLOY) if f.endswith(".yaml")}
    not_resources = {"kustomization.yaml", "prometheus-adapter-values.yaml"}
    assert set(kustomization["resources"]) == manifests - not_resources


@pytest.mark.parametrize("doc", _kustomize_resources(), ids=lambda d: d["kind"])
def test_manifest_is_valid_kubernetes(doc):
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_strict_validation_catches_a_misspelt_field():
    deployment = _one("Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["livenesProbe"] = container.pop("livenessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (kustomize) is not installed")
def test_kustomize_build_is_valid():
    out = subprocess.run(["kubectl", "kustomize", DEPLOY], capture_output=True, text=True, timeout=60, check=True)
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert sorted(d["kind"] for d in docs) == ["Deployment", "HorizontalPodAutoscaler", "NetworkPolicy", "Service"]
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_container_args_match_the_service_and_the_dockerfile():
    container = _container()
    flags = _flags(container["args"])
    dockerfile_cmd = _exec_form([arg for word, arg in _dockerfile_instructions() if word == "CMD"][-1])
    assert flags == _flags(dockerfile_cmd)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"grpc": _port_of(flags["--grpc"])[1], "rest": _port_of(flags["--rest"])[1]}
    assert all(_port_of(flags[f])[0] == "0.0.0.0" for f in ("--grpc", "--rest"))
    service = _one("Service")
    assert service["spec"]["selector"] == _one("Deployment")["spec"]["selector"]["matchLabels"]
    assert {(p["name"], p["port"], p["targetPort"]) for p in service["spec"]["ports"]} == {
        ("grpc", 5500, "grpc"),
        ("rest", 1500, "rest"),
    }


def test_the_api_key_comes_from_a_secret_in_kubernetes_and_docker():
    flags = _flags(_container()["args"])
    key_file = flags["--api_key_file"]
    assert (
        key_file
        == _flags(_exec_form([arg for word, arg in _dockerfile_instructions() if word == "CMD"][-1]))["--api_key_file"]
    )
    pod = _one("Deployment")["spec"]["template"]["spec"]
    mount = next(m for m in _container()["volumeMounts"] if key_file.startswith(m["mountPath"] + "/"))
    assert mount["readOnly"] is True
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert volume["secret"]["secretName"] == "mindspore-serving-api-key"
    assert [item["path"] for item in volume["secret"]["items"]] == [os.path.basename(key_file)]
    assert pod["automountServiceAccountToken"] is False
    # The Secret's files belong to root and the pod's fsGroup: the server's user reads the key through its group
    context = pod["securityContext"]
    assert context["fsGroup"] == context["runAsUser"] != 0
    assert volume["secret"]["defaultMode"] & 0o040 and not volume["secret"]["defaultMode"] & 0o007


def test_the_network_policy_opens_the_public_ports_only():
    policy = _one("NetworkPolicy")["spec"]
    assert policy["podSelector"]["matchLabels"] == _one("Deployment")["spec"]["selector"]["matchLabels"]
    assert set(policy["policyTypes"]) == {"Ingress", "Egress"} and policy["egress"] == []
    assert [sorted(p["port"] for p in rule["ports"]) for rule in policy["ingress"]] == [["grpc", "rest"]]
    assert {p["name"] for p in _container()["ports"]} == {"grpc", "rest"}


def _probes():
    container = _container()
    return {kind: container[kind] for kind in ("startupProbe", "livenessProbe", "readinessProbe")}


def test_probes_use_the_rest_port_and_their_routes():
    probes = _probes()
    assert {kind: p["httpGet"]["path"] for kind, p in probes.items()} == {
        "startupProbe": "/health",
        "livenessProbe": "/health",
        "readinessProbe": "/ready",
    }
    assert all(p["httpGet"]["port"] == "rest" for p in probes.values())


def test_startup_probe_allows_model_loading():
    startup = _probes()["startupProbe"]
    budget = startup.get("initialDelaySeconds", 0) + startup["periodSeconds"] * startup["failureThreshold"]
    # the front ends open only after every worker loaded its models and the LLM agent warmed its graphs
    assert budget >= 180, budget


def test_prometheus_annotations_point_at_metrics_on_the_rest_port():
    annotations = _one("Deployment")["spec"]["template"]["metadata"]["annotations"]
    rest_port = _port_of(_flags(_container()["args"])["--rest"])[1]
    assert annotations == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(rest_port),
        "prometheus.io/path": "/metrics",
    }


@pytest.mark.parametrize("path", ["/health", "/ready", "/metrics"])
def test_probed_and_scraped_paths_are_served(path):
    from fastapi.testclient import TestClient

    from mindspore_serving.frontends.restful_server import add_metrics_route

    class Collector:
        async def render(self):
            return b"# no samples\n"

    app = build_docs_app()  # as the RESTful front end builds it (ready: no master here)
    add_metrics_route(app, Collector())
    assert TestClient(app).get(path).status_code == 200


def test_termination_grace_outlasts_prestop_and_drain():
    pod = _one("Deployment")["spec"]["template"]["spec"]
    grace = float(_flags(_container()["args"])["--grace"])
    pre_stop = _container()["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    assert pod["terminationGracePeriodSeconds"] > float(pre_stop[1]) + grace + DRAIN_MARGIN_S


def test_resources_have_requests_and_limits():
    resources = _container()["resources"]
    for key in ("requests", "limits"):
        assert set(resources[key]) == {"cpu", "memory"}


def test_hpa_scales_the_deployment_on_the_documented_metrics():
    hpa = _one("HorizontalPodAutoscaler")
    deployment = _one("Deployment")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    pods_metrics = [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"]
    assert pods_metrics == ["mindspore_serving_enqueued_requests", "mindspore_serving_num_requests_waiting"]
    assert [m["resource"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "Resource"] == ["cpu"]
    # the adapter publishes exactly those names, from the gauges GET /metrics exposes
    rules = yaml.safe_load(_read("deploy", "prometheus-adapter-values.yaml"))["rules"]["custom"]
    assert [r["name"]["as"] for r in rules] == pods_metrics
    exposed = [re.search(r'__name__="([^"]+)"', r["seriesQuery"]).group(1) for r in rules]
    assert exposed == ["mindspore_serving_enqueued_requests", "mindspore_serving:num_requests_waiting"]
    from mindspore_serving.common.metrics import FAMILIES, GAUGE

    assert all(FAMILIES[name].kind == GAUGE for name in exposed)  # what GET /metrics really exposes
    doc = _read(*DEPLOY_DOC)
    assert all(name in doc for name in exposed + pods_metrics)


def test_documented_commands_use_the_files():
    doc = _read(*DEPLOY_DOC)
    assert "docker build" in doc and "kubectl apply -k deploy" in doc
    docker_run = doc.split("docker run", 1)[1].split("\n", 1)[0]
    assert "--stop-timeout" in docker_run, "docker stop's default 10 s would cut the drain short"
