"""The bundled SmolLM2-135M-Instruct GGUF served by the engine and by llama.cpp, side by side.

Used by bench/engine.py (`--real`). Both servers get the same file, the same thread
count and the same streamed /v1/completions requests (greedy, 128 new tokens, EOS
banned: `ignore_eos` for the engine, a -100 logit bias for llama.cpp). llama.cpp is the
`llama-cpp-python` server from its own virtual environment (`--llama-cpp PYTHON`, or
$ROUTEGATE_LLAMA_CPP_PYTHON); it serves one request at a time. Without it, only the
engine's figures are printed.

The two servers never overlap: each one runs in its own process group, which is killed
and reaped (and its port checked closed) before the next starts, and the next starts
only once the machine is idle again (`wait_idle`). Each side's figures carry the load
average before and after it, so a run disturbed by other work shows as such.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
MODEL = "smollm2-135m-instruct"
NEW_TOKENS = 128
EOS_ID = 2  # SmolLM2's <|im_end|>
QUESTIONS = [
    "What is the capital of France?", "Explain photosynthesis to a child.",
    "Write a short poem about the sea.", "List five fruits and their colours.",
    "How do airplanes stay in the air?", "Describe a day in the life of a cat.",
    "What are the planets of the solar system?", "Give three tips for learning to cook.",
]


IDLE_BUSY_FRACTION = 0.15  # "idle": under this share of all cores busy over a second
IDLE_WAIT_S = 60.0


@dataclass
class Figures:
    load_s: float
    rows: dict[int, dict[str, float]]  # concurrency → tok_s, ttft p50/p95, decode tok/s
    load_before: float = 0.0  # 1-minute load average when the server started
    load_after: float = 0.0  # and when its last request ended
    busy_before: float = 0.0  # share of all cores busy in the second before it started


def cpu_busy_fraction(interval_s: float = 1.0) -> float:
    """Share of all cores busy (not idle or iowait) over `interval_s`, from /proc/stat."""
    def sample() -> tuple[int, int]:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        idle = fields[3] + fields[4]
        return sum(fields) - idle, sum(fields)

    busy0, total0 = sample()
    time.sleep(interval_s)
    busy1, total1 = sample()
    return (busy1 - busy0) / max(1, total1 - total0)


def wait_idle(limit_s: float = IDLE_WAIT_S) -> float:
    """Wait (at most `limit_s`) until the cores are idle; the last busy share measured."""
    deadline = time.perf_counter() + limit_s
    busy = cpu_busy_fraction()
    while busy > IDLE_BUSY_FRACTION and time.perf_counter() < deadline:
        busy = cpu_busy_fraction()
    if busy > IDLE_BUSY_FRACTION:
        print(f"warning: the machine is not idle ({busy:.0%} of the cores busy): "
              "treat the figures that follow as disturbed", file=sys.stderr)
    return busy


def port_closed(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def stop_server(proc: subprocess.Popen[bytes], port: int) -> None:
    """End the server's whole process group and reap it; the port must be closed after."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    with contextlib.suppress(ProcessLookupError):  # children that outlived the leader
        os.killpg(proc.pid, signal.SIGKILL)
    for _ in range(100):
        if port_closed(port):
            return
        time.sleep(0.05)
    raise SystemExit(f"port {port} still answers after its server was stopped")


def chat_prompt(question: str) -> str:
    return (f"<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
            f"Hugging Face<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n"
            f"<|im_start|>assistant\n")


async def stream_one(http: aiohttp.ClientSession, url: str, body: dict[str, object]
                     ) -> tuple[float, float, int]:
    """Time to first token, time of the last, completion tokens (from usage or chunks)."""
    start = time.perf_counter()
    first = last = 0.0
    chunks = usage = 0
    async with http.post(url, json=body) as resp:
        resp.raise_for_status()
        async for line in resp.content:
            if not line.startswith(b"data: {"):
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                usage = event["usage"]["completion_tokens"]
            if event.get("choices") and event["choices"][0].get("text"):
                last = time.perf_counter()
                first = first or last
                chunks += 1
    return first - start, last - first, usage or chunks


async def measure(url: str, body: dict[str, object], concurrency: int, rounds: int
                  ) -> dict[str, float]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=900)) as http:
        await stream_one(http, url, {**body, "prompt": chat_prompt("Hi"), "max_tokens": 8})
        ttfts, decode_rates, total = [], [], 0
        t0 = time.perf_counter()
        for r in range(rounds):
            batch = [QUESTIONS[(r * concurrency + i) % len(QUESTIONS)] for i in range(concurrency)]
            results = await asyncio.gather(*(
                stream_one(http, url, {**body, "prompt": chat_prompt(q)}) for q in batch))
            for ttft, decode_s, tokens in results:
                ttfts.append(ttft)
                decode_rates.append((tokens - 1) / decode_s if decode_s > 0 else 0.0)
                total += tokens
        wall = time.perf_counter() - t0
    ordered = sorted(ttfts)
    return {"tok_s": total / wall, "ttft_p50": statistics.median(ordered),
            "ttft_p95": ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))],
            "decode_tok_s": statistics.mean(decode_rates)}


async def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 300) -> None:
    deadline = time.perf_counter() + timeout_s
    async with aiohttp.ClientSession() as http:
        while time.perf_counter() < deadline:
            if proc.poll() is not None:
                raise SystemExit(f"{url}: the server exited during start-up")
            try:
                async with http.get(url) as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
    raise SystemExit(f"{url}: not ready after {timeout_s:.0f} s")


def serve(command: list[str], port: int, ready_url: str, body: dict[str, object], url: str,
          concurrency: list[int]) -> Figures:
    if not port_closed(port):
        raise SystemExit(f"port {port} is already taken")
    busy = wait_idle()
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    # A session of its own, so that stopping it ends every process it started.
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        asyncio.run(wait_ready(ready_url, proc))
        load_s = time.perf_counter() - started
        rows = {c: asyncio.run(measure(url, body, c, 3 if c == 1 else 1)) for c in concurrency}
        load_after = os.getloadavg()[0]
    finally:
        stop_server(proc, port)
    return Figures(load_s, rows, load_before, load_after, busy)


def engine(port: int, threads: int, concurrency: list[int], weights: str = "auto") -> Figures:
    base = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "local_backend", "--model", MODEL, "--port", str(port),
               "--threads", str(threads), "--weights", weights]
    body = {"model": MODEL, "max_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    return serve(command, port, base + "/health", body, base + "/v1/completions", concurrency)


def llama_cpp(python: str, gguf: Path, port: int, threads: int, concurrency: list[int]
              ) -> Figures:
    base = f"http://127.0.0.1:{port}"
    command = [python, "-m", "llama_cpp.server", "--model", str(gguf), "--port", str(port),
               "--n_threads", str(threads), "--n_ctx", "2048",
               # By default a new request cuts off the one streaming: queue it instead.
               "--interrupt_requests", "False"]
    body = {"model": MODEL, "max_tokens": NEW_TOKENS, "temperature": 0, "stream": True,
            "logit_bias": {str(EOS_ID): -100.0}}
    return serve(command, port, base + "/v1/models", body, base + "/v1/completions", concurrency)


def llama_cpp_python(option: str | None) -> str | None:
    candidate = option or os.environ.get("ROUTEGATE_LLAMA_CPP_PYTHON")
    if candidate is None:
        return None
    probe = subprocess.run([candidate, "-c", "import llama_cpp.server"], capture_output=True,
                           check=False)
    return candidate if probe.returncode == 0 else None


def report(ours: Figures, theirs: Figures | None, threads: int, why_missing: str,
           weights: str = "auto") -> None:
    print(f"\nreal model: {MODEL} (GGUF Q4_1; engine --weights {weights}), {threads} CPU "
          f"threads, {NEW_TOKENS} new tokens per request, greedy")
    print(f"{'':28}{'load s':>8}{'tok/s':>9}{'TTFT p50 ms':>13}{'p95 ms':>9}{'decode tok/s':>14}"
          f"{'load avg':>16}")
    for label, figures in (("engine", ours), ("llama.cpp", theirs)):
        if figures is None:
            print(f"{label:28}{why_missing}")
            continue
        for c, row in figures.rows.items():
            print(f"{f'{label}, {c} concurrent':28}{figures.load_s:8.1f}{row['tok_s']:9.1f}"
                  f"{row['ttft_p50'] * 1e3:13.0f}{row['ttft_p95'] * 1e3:9.0f}"
                  f"{row['decode_tok_s']:14.1f}"
                  f"{figures.load_before:8.2f} → {figures.load_after:.2f}")
        print(f"{'':28}(started with {figures.busy_before:.0%} of the cores busy)")
    if theirs is None or 16 not in ours.rows or 1 not in ours.rows:
        return
    print("\nchecks (issues 20 and 36):")
    checks = [
        ("tok/s at 16 streams ≥ 3× llama.cpp's", ours.rows[16]["tok_s"] / theirs.rows[16]["tok_s"],
         3.0),
        ("single-stream decode ≥ 0.8× llama.cpp's",
         ours.rows[1]["decode_tok_s"] / theirs.rows[1]["decode_tok_s"], 0.8),
    ]
    for label, value, bound in checks:
        print(f"  {label:42} {value:6.2f}  {'ok' if value >= bound else 'MISSED'}")
