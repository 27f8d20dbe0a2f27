"""`routegate policy check|schema` and `routegate keys new|hash`, through their real parsers."""

from __future__ import annotations

import argparse
import io
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from gateway.commands import keys as key_commands
from gateway.commands import policy as policy_commands
from policies import hash_key, loads
from policies.json_schema import policy_json_schema

GOOD = """\
version: 1
backends:
  local:
    type: openai
    url: http://127.0.0.1:8001/v1
    deployment: dedicated
    gpu_hour_usd: 1.0
    models: {llama: {}}
routes:
  chat: {targets: [local/llama]}
"""


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    parser = argparse.ArgumentParser(prog="routegate")
    subparsers = parser.add_subparsers(dest="command", required=True)
    policy_commands.add_parser(subparsers)
    key_commands.add_parser(subparsers)
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.func
    code = handler(args)
    return code, capsys.readouterr().out


@pytest.fixture
def good(tmp_path: Path) -> Path:
    path = tmp_path / "good.yaml"
    path.write_text(GOOD)
    return path


@pytest.fixture
def bad(tmp_path: Path) -> Path:
    path = tmp_path / "bad.yaml"
    path.write_text(GOOD.replace("objective", "x").replace(
        "{targets: [local/llama]}", "{targets: [local/lama], objectiv: fastest}"))
    return path


def test_check_exits_zero_for_a_valid_file(good: Path, capsys: pytest.CaptureFixture[str]
                                           ) -> None:
    code, out = run(["policy", "check", str(good)], capsys)
    assert code == 0
    assert f"{good}: ok, version" in out
    assert "(1 target, 1 route, 0 tenants)" in out


def test_check_exits_one_and_prints_every_error_with_its_place(
        good: Path, bad: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(["policy", "check", str(good), str(bad)], capsys)
    assert code == 1
    assert (f"error: {bad}:10:33: routes.chat.objectiv: unknown key `objectiv` "
            "(hint: did you mean `objective`?)") in out
    assert f"{bad}: invalid (1 error)" in out


def test_check_json_lists_errors_per_file(bad: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(["policy", "check", "--json", str(bad)], capsys)
    result = json.loads(out)
    assert code == 1 and result["valid"] is False
    [error] = result["files"][0]["errors"]
    assert (error["line"], error["column"], error["field"]) == (10, 33, "routes.chat.objectiv")


def test_check_reports_the_second_pass_errors_with_hints(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "target.yaml"
    path.write_text(GOOD.replace("[local/llama]", "[local/lama]"))
    code, out = run(["policy", "check", str(path)], capsys)
    assert code == 1
    assert "routes.chat.targets[0]: target `local/lama` names no backend model " \
           "(hint: did you mean `local/llama`?)" in out


def test_check_env_option_sets_variables(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                         ) -> None:
    path = tmp_path / "env.yaml"
    path.write_text(GOOD.replace("gpu_hour_usd: 1.0", "gpu_hour_usd: ${RG_TEST_GPU_PRICE}"))
    assert run(["policy", "check", str(path)], capsys)[0] == 1
    assert run(["policy", "check", "--env", "RG_TEST_GPU_PRICE=2", str(path)], capsys)[0] == 0


def test_strict_check_fails_on_warnings(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                        ) -> None:
    path = tmp_path / "warn.yaml"
    path.write_text(GOOD + "tenants:\n  acme: {tags: [eu]}\n")
    assert run(["policy", "check", str(path)], capsys)[0] == 0
    code, out = run(["policy", "check", "--strict", str(path)], capsys)
    assert code == 1
    assert "warning:" in out and "tenants.acme.tags[0]" in out


def test_check_of_a_missing_file_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                       ) -> None:
    code, out = run(["policy", "check", str(tmp_path / "nope.yaml")], capsys)
    assert code == 1 and "cannot read policy file" in out


def test_schema_prints_the_json_schema(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(["policy", "schema"], capsys)
    assert code == 0 and json.loads(out) == policy_json_schema()


def test_new_key_hashes_to_the_printed_hash(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(["keys", "new", "--json", "--count", "2"], capsys)
    made = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and len(made) == 2 and made[0]["key"] != made[1]["key"]
    assert all(hash_key(item["key"]) == item["hash"] for item in made)


def test_new_key_hash_is_accepted_by_the_policy(capsys: pytest.CaptureFixture[str]) -> None:
    _, out = run(["keys", "new", "--json"], capsys)
    made = json.loads(out)
    policy = loads(GOOD + f"tenants:\n  acme: {{api_keys: ['{made['hash']}']}}\n", environ={})
    assert policy.tenant_by_key_hash[made["hash"]] == "acme"


def test_hash_of_a_known_key(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(["keys", "hash", "abc"], capsys)
    assert code == 0
    assert out.strip() == (
        "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")


def test_hash_reads_the_key_from_stdin_when_not_given() -> None:
    out = io.StringIO()
    assert key_commands.keys_hash(None, stdin=io.StringIO("abc\n"), out=out) == 0
    assert out.getvalue().strip() == hash_key("abc")


@pytest.mark.parametrize("command", ["check", "explain"])
def test_env_option_without_a_value_is_a_usage_error(
        command: str, good: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # `--env NAME` would otherwise set NAME to "" and pass as if the value were given.
    extra = [str(good)] if command == "explain" else []
    with pytest.raises(SystemExit) as exited:
        run(["policy", command, "--env", "RG_TEST_GPU_PRICE", str(good), *extra], capsys)
    assert exited.value.code == 2
    assert "NAME=VALUE" in capsys.readouterr().err


def test_an_enabled_backend_with_an_empty_key_warns_and_fails_a_strict_check(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "keyless.yaml"
    path.write_text(GOOD.replace("    type: openai\n", "    type: openai\n    api_key: ''\n", 1))
    code, out = run(["policy", "check", str(path)], capsys)
    assert code == 0 and "warning:" in out and "backends.local.api_key" in out
    assert run(["policy", "check", "--strict", str(path)], capsys)[0] == 1


def test_reference_prints_every_section_of_the_policy_reference(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(["policy", "reference"], capsys)
    assert code == 0 and out.startswith("# Policy file reference")
    assert "## Backend\n" in out and "| `api_key` |" in out
