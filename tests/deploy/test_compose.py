"""deploy/compose.yaml runs as shipped: services start in order of health, the gateway
serves only the documented key, Grafana has its data source and dashboard, and the
images' commands are ones the CLI takes."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import yaml

from gateway.commands.policy import check_files
from policies.keys import hash_key
from policies.load import load
from tests.deploy.manifests import (
    DEMO_ADMIN_KEY,
    DEMO_KEY,
    DEPLOY,
    dockerfile_stages,
    env_read_by,
    parse_gateway_command,
    parse_local_backend_command,
    policy_variables,
)

COMPOSE = DEPLOY / "compose.yaml"


def services() -> dict[str, dict[str, Any]]:
    return yaml.safe_load(COMPOSE.read_text())["services"]  # type: ignore[no-any-return]


def mounted(service: str, target: str) -> Path:
    for volume in services()[service].get("volumes", []):
        source, _, rest = volume.partition(":")
        if rest.split(":")[0] == target:
            return (COMPOSE.parent / source).resolve()
    raise AssertionError(f"{service} mounts nothing at {target}")


def gateway_policy() -> Path:
    stage = dockerfile_stages()["base"]
    args = parse_gateway_command(stage["CMD"])
    return mounted("gateway", str(args.policy))


def test_every_dependency_waits_for_a_health_check_where_one_exists() -> None:
    all_services = services()
    for service in all_services.values():
        for name, condition in service.get("depends_on", {}).items():
            wanted = condition["condition"]
            if "healthcheck" in all_services[name]:
                assert wanted == "service_healthy", name
            else:
                assert wanted == "service_started", name
    for name in ("redis", "local-backend", "gateway"):
        assert "healthcheck" in all_services[name]


def test_the_gateway_policy_passes_policy_check_with_the_compose_env() -> None:
    env = {k: str(v) for k, v in services()["gateway"]["environment"].items()
           if not str(v).startswith("${")}
    out = io.StringIO()
    assert check_files([str(gateway_policy())], strict=True, environ=env,
                       out=out) == 0, out.getvalue()


def test_anonymous_access_is_off_and_the_documented_keys_work() -> None:
    policy = load(gateway_policy(), environ={})
    assert not policy.file.auth.anonymous.enabled
    assert hash_key(DEMO_KEY) in {key for tenant in policy.file.tenants.values()
                                  for key in tenant.api_keys}
    assert hash_key(DEMO_ADMIN_KEY) in policy.file.auth.admin_keys
    assert DEMO_KEY in COMPOSE.read_text()  # where a user finds it


def test_the_images_default_commands_are_ones_the_cli_accepts() -> None:
    stages = dockerfile_stages()
    assert stages["base"]["ENTRYPOINT"] == ["routegate"]
    assert parse_gateway_command(stages["base"]["CMD"]).command == "serve"
    assert stages["local-backend"]["ENTRYPOINT"] == ["python", "-m", "local_backend"]
    parse_local_backend_command(stages["local-backend"]["CMD"])


def test_the_local_backends_cache_dir_is_a_writable_volume() -> None:
    stage = dockerfile_stages()["local-backend"]
    assert "ROUTEGATE_CACHE_DIR" in stage["ENV"]
    assert "ROUTEGATE_CACHE_DIR" in env_read_by("local_backend")
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    cache = dockerfile.split("ROUTEGATE_CACHE_DIR=")[1].split()[0]
    assert f"chown 10001:10001 {cache}" in dockerfile  # the image's user owns it
    named_volumes = yaml.safe_load(COMPOSE.read_text())["volumes"]
    assert any(v.split(":")[0] in named_volumes and v.split(":")[1] == cache
               for v in services()["local-backend"]["volumes"])


def test_every_variable_set_is_one_the_code_reads() -> None:
    policy_text = gateway_policy().read_text()
    assert set(services()["gateway"]["environment"]) <= (
        env_read_by("gateway") | policy_variables(policy_text))
    assert set(services()["local-backend"]["environment"]) <= env_read_by("local_backend")


def test_grafana_is_provisioned_with_the_data_source_and_the_dashboard() -> None:
    datasources = yaml.safe_load(mounted(
        "grafana", "/etc/grafana/provisioning/datasources/routegate.yaml").read_text())
    prometheus = datasources["datasources"][0]
    assert prometheus["type"] == "prometheus" and prometheus["isDefault"]
    assert prometheus["url"].startswith("http://prometheus:")
    provider = yaml.safe_load(mounted(
        "grafana", "/etc/grafana/provisioning/dashboards/routegate.yaml").read_text())
    folder = provider["providers"][0]["options"]["path"]
    assert mounted("grafana", folder + "/routegate.json").is_file()
