"""The bundled SmolLM2-135M-Instruct GGUF served by the engine and by llama.cpp, side by side.

Used by bench/engine.py (`--real`). Both servers get the same file, the same thread
count and the same streamed /v1/completions requests (greedy, 128 new tokens, EOS
banned: `ignore_eos` for the engine, a -100 logit bias for llama.cpp). llama.cpp is the
`llama-cpp-python` server from its own virtual environment (`--llama-cpp PYTHON`, or
$ROUTEGATE_LLAMA_CPP_PYTHON); it serves one request at a time. Without it, only the
engine's figures are printed.
"""

from __future__ import annotations

import asyncio
import json
import os
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


@dataclass
class Figures:
    load_s: float
    rows: dict[int, dict[str, float]]  # concurrency → tok_s, ttft p50/p95, decode tok/s


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


def serve(command: list[str], ready_url: str, body: dict[str, object], url: str,
          concurrency: list[int]) -> Figures:
    started = time.perf_counter()
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        asyncio.run(wait_ready(ready_url, proc))
        load_s = time.perf_counter() - started
        rows = {c: asyncio.run(measure(url, body, c, 3 if c == 1 else 1)) for c in concurrency}
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return Figures(load_s, rows)


def engine(port: int, threads: int, concurrency: list[int], weights: str = "auto") -> Figures:
    base = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "local_backend", "--model", MODEL, "--port", str(port),
               "--threads", str(threads), "--weights", weights]
    body = {"model": MODEL, "max_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    return serve(command, base + "/health", body, base + "/v1/completions", concurrency)


def llama_cpp(python: str, gguf: Path, port: int, threads: int, concurrency: list[int]
              ) -> Figures:
    base = f"http://127.0.0.1:{port}"
    command = [python, "-m", "llama_cpp.server", "--model", str(gguf), "--port", str(port),
               "--n_threads", str(threads), "--n_ctx", "2048",
               # By default a new request cuts off the one streaming: queue it instead.
               "--interrupt_requests", "False"]
    body = {"model": MODEL, "max_tokens": NEW_TOKENS, "temperature": 0, "stream": True,
            "logit_bias": {str(EOS_ID): -100.0}}
    return serve(command, base + "/v1/models", body, base + "/v1/completions", concurrency)


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
    print(f"{'':28}{'load s':>8}{'tok/s':>9}{'TTFT p50 ms':>13}{'p95 ms':>9}{'decode tok/s':>14}")
    for label, figures in (("engine", ours), ("llama.cpp", theirs)):
        if figures is None:
            print(f"{label:28}{why_missing}")
            continue
        for c, row in figures.rows.items():
            print(f"{f'{label}, {c} concurrent':28}{figures.load_s:8.1f}{row['tok_s']:9.1f}"
                  f"{row['ttft_p50'] * 1e3:13.0f}{row['ttft_p95'] * 1e3:9.0f}"
                  f"{row['decode_tok_s']:14.1f}")
    if theirs is None or 16 not in ours.rows or 1 not in ours.rows:
        return
    print("\nchecks (issue 20):")
    checks = [
        ("tok/s at 16 streams ≥ 3× llama.cpp's", ours.rows[16]["tok_s"] / theirs.rows[16]["tok_s"],
         3.0),
        ("single-stream decode ≥ 0.4× llama.cpp's",
         ours.rows[1]["decode_tok_s"] / theirs.rows[1]["decode_tok_s"], 0.4),
    ]
    for label, value, bound in checks:
        print(f"  {label:42} {value:6.2f}  {'ok' if value >= bound else 'MISSED'}")
