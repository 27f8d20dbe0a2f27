"""`python -m local_backend --model demo` comes up healthy in seconds; bad paths fail clearly."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from local_backend.__main__ import main


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


@pytest.mark.slow
def test_demo_model_serves_health_and_chat(tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "ROUTEGATE_CACHE_DIR": str(tmp_path)}
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "local_backend", "--model", "demo", "--port", str(port),
         "--threads", "1"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                assert get_json(f"http://127.0.0.1:{port}/health") == {"status": "ok"}
                break
            except OSError:
                assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
                assert time.monotonic() < deadline, "no /health within 60 s"
                time.sleep(0.1)
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            data=json.dumps({"model": "demo", "max_tokens": 4,
                             "messages": [{"role": "user", "content": "hi"}]}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as resp:
            body = json.loads(resp.read())
            assert "inference;dur=" in resp.headers["Server-Timing"]
        assert body["model"] == "demo" and body["usage"]["completion_tokens"] >= 1
        assert (tmp_path / "demo-model-v2" / "config.json").is_file()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_missing_model_directory_exits_with_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--model", str(tmp_path / "nowhere"), "--device", "cpu"]) == 2
    assert "does not exist" in capsys.readouterr().err
