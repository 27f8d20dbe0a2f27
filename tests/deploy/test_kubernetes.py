"""deploy/k8s runs as shipped: valid against the Kubernetes schemas (offline), every
name it refers to defined, its policy valid and serving authenticated callers, its
images' commands and environment the ones the CLI takes."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from gateway.commands.policy import check_files
from policies.keys import hash_key
from policies.load import loads
from tests.deploy.manifests import (
    DEMO_ADMIN_KEY,
    DEMO_KEY,
    env_read_by,
    k8s_documents,
    named,
    of_kind,
    parse_gateway_command,
    parse_local_backend_command,
    pod_specs,
    policy_variables,
)

KUBERNETES_VERSION = "1.30"
# The Prometheus Operator's CRD, the part of its schema the manifests use (the CRD is
# not among kubernetes-validate's built-in schemas).
SERVICE_MONITOR = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object", "required": ["selector", "endpoints"],
            "additionalProperties": False,
            "properties": {
                "selector": {"type": "object", "properties": {
                    "matchLabels": {"type": "object",
                                    "additionalProperties": {"type": "string"}}}},
                "endpoints": {"type": "array", "minItems": 1, "items": {
                    "type": "object", "additionalProperties": False,
                    "properties": {"port": {"type": "string"}, "path": {"type": "string"},
                                   "interval": {"type": "string",
                                                "pattern": "^[0-9]+(ms|s|m|h)$"},
                                   # the CRD's SafeAuthorization: a Secret's key
                                   "authorization": {
                                       "type": "object", "additionalProperties": False,
                                       "properties": {
                                           "type": {"type": "string"},
                                           "credentials": {
                                               "type": "object", "required": ["key"],
                                               "additionalProperties": False,
                                               "properties": {
                                                   "name": {"type": "string"},
                                                   "key": {"type": "string"},
                                                   "optional": {"type": "boolean"}}}}}}}},
            },
        },
    },
}


def gateway_container() -> dict[str, Any]:
    return named("Deployment", "routegate")["spec"]["template"]["spec"]["containers"][0]


def resolved_env(container: dict[str, Any]) -> dict[str, str]:
    """The container's environment, Secret references resolved from the manifests."""
    env = {}
    for variable in container.get("env", []):
        if "value" in variable:
            env[variable["name"]] = variable["value"]
            continue
        ref = variable["valueFrom"]["secretKeyRef"]
        env[variable["name"]] = named("Secret", ref["name"])["stringData"][ref["key"]]
    return env


def embedded_policy(tmp_path: Path) -> tuple[Path, str]:
    mount = next(m for m in gateway_container()["volumeMounts"] if m["name"] == "policy")
    args = parse_gateway_command(gateway_container()["args"])
    assert args.policy.parent == Path(mount["mountPath"])
    text = named("ConfigMap", "routegate-policy")["data"][args.policy.name]
    path = tmp_path / args.policy.name
    path.write_text(text)
    return path, text


@pytest.mark.parametrize("document", [document for _, document in k8s_documents()],
                         ids=[f"{path.name}:{document['kind']}/{document['metadata']['name']}"
                              for path, document in k8s_documents()])
def test_every_manifest_is_valid_against_the_kubernetes_schemas(
        document: dict[str, Any]) -> None:
    if document["kind"] == "ServiceMonitor":
        jsonschema.validate(document, SERVICE_MONITOR)
    else:  # strict: an unknown field is an error, as `kubectl apply` makes it
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


def test_a_misspelt_field_is_caught_by_the_schema_check() -> None:
    deployment = named("Deployment", "routegate")
    bad = yaml.safe_load(yaml.safe_dump(deployment).replace("readinessProbe", "readynessProbe"))
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBERNETES_VERSION, strict=True)


def test_the_embedded_policy_passes_policy_check_with_the_deployments_env(
        tmp_path: Path) -> None:
    path, text = embedded_policy(tmp_path)
    env = resolved_env(gateway_container())
    assert policy_variables(text) <= set(env)
    out = io.StringIO()
    assert check_files([str(path)], strict=True, environ=env, out=out) == 0, out.getvalue()


def test_the_policy_serves_the_documented_keys_and_nobody_anonymous(tmp_path: Path) -> None:
    _, text = embedded_policy(tmp_path)
    policy = loads(text, environ=resolved_env(gateway_container()))
    assert not policy.file.auth.anonymous.enabled
    assert hash_key(DEMO_KEY) in {key for tenant in policy.file.tenants.values()
                                  for key in tenant.api_keys}
    assert hash_key(DEMO_ADMIN_KEY) in policy.file.auth.admin_keys
    assert "sha256:" in named("Secret", "routegate-keys")["stringData"]["app-key-hash"]


def test_the_grace_period_covers_pre_stop_announce_and_drain_timeout(tmp_path: Path) -> None:
    pod = named("Deployment", "routegate")["spec"]["template"]["spec"]
    container = gateway_container()
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    _, text = embedded_policy(tmp_path)
    drain = loads(text, environ=resolved_env(container)).file.server.drain
    assert drain.announce_s > 0
    assert pod["terminationGracePeriodSeconds"] > (
        float(pre_stop[1]) + drain.announce_s + drain.timeout_s)


def test_the_gateway_probes_its_health_and_readiness_endpoints() -> None:
    container = gateway_container()
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert {"requests", "limits"} <= set(container["resources"])


def test_images_run_commands_the_cli_accepts() -> None:
    for _, pod in pod_specs():
        for container in pod["containers"]:
            image = container["image"].split(":")[0]
            if image == "routegate":
                assert parse_gateway_command(container["args"]).command == "serve"
            elif image == "routegate-local-backend":
                args = parse_local_backend_command(container["args"])
                assert args.host == "0.0.0.0"
                assert str(args.port) == str(container["ports"][0]["containerPort"])


def test_every_variable_set_is_one_the_code_reads(tmp_path: Path) -> None:
    _, text = embedded_policy(tmp_path)
    read = {"routegate": env_read_by("gateway") | policy_variables(text),
            "routegate-local-backend": env_read_by("local_backend")}
    for _, pod in pod_specs():
        for container in pod["containers"]:
            image = container["image"].split(":")[0]
            if image in read:
                assert {v["name"] for v in container.get("env", [])} <= read[image]


def test_every_name_a_manifest_refers_to_is_defined() -> None:
    services = {s["metadata"]["name"]: s for s in of_kind("Service")}
    claims = {c["metadata"]["name"] for c in of_kind("PersistentVolumeClaim")}
    config_maps = {c["metadata"]["name"] for c in of_kind("ConfigMap")}
    for name, pod in pod_specs():
        labels = next(d for k in ("Deployment", "StatefulSet") for d in of_kind(k)
                      if d["metadata"]["name"] == name)["spec"]["template"]["metadata"]["labels"]
        for volume in pod.get("volumes", []):
            if "persistentVolumeClaim" in volume:
                assert volume["persistentVolumeClaim"]["claimName"] in claims
            if "configMap" in volume:
                assert volume["configMap"]["name"] in config_maps
        for container in pod["containers"]:
            ports = {p["name"] for p in container.get("ports", []) if "name" in p}
            for value in (v.get("value", "") for v in container.get("env", [])):
                host = re.match(r"https?://([^:/]+)", value)
                if host:  # an endpoint it calls: a Service of these manifests
                    assert host.group(1) in services, value
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                port = container.get(probe, {}).get("httpGet", {}).get("port")
                assert port is None or port in ports
        for service in services.values():
            if service["spec"]["selector"].items() <= labels.items():
                for port in service["spec"]["ports"]:
                    target = port.get("targetPort")
                    assert not isinstance(target, str) or target in {
                        p.get("name") for c in pod["containers"] for p in c.get("ports", [])}


def test_redis_keeps_spend_on_a_persistent_volume() -> None:
    redis = named("StatefulSet", "routegate-redis")
    container = redis["spec"]["template"]["spec"]["containers"][0]
    assert "--appendonly" in container["args"]
    data_dir = container["args"][container["args"].index("--dir") + 1]
    templates = {t["metadata"]["name"] for t in redis["spec"]["volumeClaimTemplates"]}
    assert any(m["name"] in templates and m["mountPath"] == data_dir
               for m in container["volumeMounts"])


def test_the_local_backend_asks_for_a_gpu_and_mounts_its_model_volume() -> None:
    pod = named("Deployment", "routegate-local-backend")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    cache = {v["name"]: v["value"] for v in container["env"]}["ROUTEGATE_CACHE_DIR"]
    assert any(cache.startswith(m["mountPath"]) for m in container["volumeMounts"])


def test_the_autoscaler_budget_and_monitor_target_the_gateway() -> None:
    assert named("HorizontalPodAutoscaler", "routegate")["spec"]["scaleTargetRef"][
        "name"] == "routegate"
    labels = named("Deployment", "routegate")["spec"]["template"]["metadata"]["labels"]
    assert named("PodDisruptionBudget", "routegate")["spec"]["selector"][
        "matchLabels"].items() <= labels.items()
    monitor = named("ServiceMonitor", "routegate")
    service = named("Service", "routegate")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"][
        "labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] in {p["name"] for p in
                                                        service["spec"]["ports"]}


def test_the_collector_config_defines_every_component_its_pipeline_uses() -> None:
    config = yaml.safe_load(named("ConfigMap", "otel-collector")["data"]["config.yaml"])
    for pipeline in config["service"]["pipelines"].values():
        for section in ("receivers", "processors", "exporters"):
            assert set(pipeline.get(section, [])) <= set(config.get(section, {}))
