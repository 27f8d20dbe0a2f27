"""`python -m local_backend --model PATH|demo [--host H] [--port P] ...`: load, then serve."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Literal

import torch

from local_backend.checkpoint import BUNDLED, Checkpoint, load_checkpoint
from local_backend.engine.capacity import (
    CPU_KV_BUDGET_BYTES,
    DeviceDefaults,
    defaults_for,
    kv_blocks,
)
from local_backend.engine.loop import Engine, EngineConfig
from local_backend.engine.priority import (
    DEFAULT_AGING_S,
    DEFAULT_BACKGROUND_BAND,
    DEFAULT_BACKGROUND_STEP_TOKENS,
)
from local_backend.engine.runner import ModelRunner
from local_backend.model.config import ModelLoadError
from local_backend.model.cpu_weights import CPU_WEIGHTS, CpuWeights
from local_backend.model.llama import LlamaForCausalLM
from local_backend.server.app import create_app
from local_backend.server.idempotency import (
    DEFAULT_MAX_ANSWERS,
    DEFAULT_TTL_S,
    IdempotencyLimits,
)
from local_backend.server.runner import serve
from local_backend.telemetry import install, tracer_provider_from_env

log = logging.getLogger("local_backend")


def _band_or_none(text: str) -> int | None:
    if text.strip().lower() == "none":
        return None
    try:
        band = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a band number or 'none': {text!r}") from None
    if band < 0:
        raise argparse.ArgumentTypeError(f"a band is 0 or more, not {band}")
    return band


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m local_backend", description=__doc__)
    p.add_argument("--model", required=True, help=(
        "a .gguf file, a checkpoint directory (safetensors or one .gguf), a bundled model "
        f"({', '.join(BUNDLED)}), or 'demo' (random weights, for tests)"))
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8001)
    p.add_argument("--max-num-seqs", type=int, default=None,
                   help="sequences per batch (default: 256 on CUDA, 32 on CPU)")
    p.add_argument("--max-waiting", type=int, default=256, help="queued requests before 429")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    p.add_argument("--num-blocks", type=int, default=None, help="KV blocks (default: by memory)")
    p.add_argument("--scheduling-policy", choices=("priority", "fcfs"), default="priority",
                   help="admit by (priority band, deadline, arrival), preempting worse bands "
                   "for better ones; or by arrival alone")
    p.add_argument("--priority-aging-s", type=float, default=DEFAULT_AGING_S, help=(
        "seconds a request waits in its band before it rises one (low never starves)"))
    p.add_argument("--background-band", type=_band_or_none, default=DEFAULT_BACKGROUND_BAND,
                   help="bands from this one down (the gateway's batch lines: 3) run only in "
                   "steps no better band wants, paused while one does; 'none': no band is "
                   "(default %(default)s)")
    p.add_argument("--background-step-tokens", type=int, default=DEFAULT_BACKGROUND_STEP_TOKENS,
                   help="tokens a step of background work alone computes at most, so a "
                   "request arriving meanwhile waits for a short step (default %(default)s)")
    p.add_argument("--idempotency-ttl-s", type=float, default=DEFAULT_TTL_S, help=(
        "seconds a finished answer is kept for a request sent again with its Idempotency-Key"))
    p.add_argument("--idempotency-max-answers", type=int, default=DEFAULT_MAX_ANSWERS, help=(
        "answers kept by Idempotency-Key at most, oldest dropped first (0: keys not honoured)"))
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--weights", choices=("auto", "fp32", *CPU_WEIGHTS), default="auto", help=(
        "how the weights are stored on CPU (docs/local-backend.md): int4 and int8 are "
        "weight-only quantisations computed in bf16, bf16 halves fp32's bytes; auto takes "
        "int4 for a 4-bit GGUF, int8 for another quantised GGUF, fp32 otherwise. On CUDA "
        "only auto (bf16 or fp16)"))
    args = p.parse_args(argv)
    if not args.priority_aging_s > 0:
        p.error("--priority-aging-s must be a positive number of seconds")
    if args.background_step_tokens < 1:
        p.error("--background-step-tokens must be at least 1")
    if not args.idempotency_ttl_s > 0 or args.idempotency_max_answers < 0:
        p.error("--idempotency-ttl-s must be positive and --idempotency-max-answers >= 0")
    return args


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(os.environ.get("ROUTEGATE_CACHE_DIR") or Path(base) / "routegate")


def weight_format(model: LlamaForCausalLM) -> str:
    return model.weight_format or str(model.compute_dtype).removeprefix("torch.")


def build_engine(
    args: argparse.Namespace, device: torch.device, dtype: torch.dtype,
    weights: CpuWeights | Literal["auto"] | None,
) -> tuple[Engine, Checkpoint, int]:
    """Load the checkpoint and build the engine around it; returns it with its KV blocks."""
    checkpoint = load_checkpoint(args.model, cache_dir(), device=device, dtype=dtype,
                                 progress=sys.stderr if sys.stderr.isatty() else None,
                                 weights=weights)
    model, tokenizer = checkpoint.model, checkpoint.tokenizer
    per_block = ModelRunner.kv_bytes_per_block(model, args.block_size)
    defaults = defaults_for(device)
    if args.max_num_seqs is not None:
        defaults = DeviceDefaults(args.max_num_seqs, defaults.max_num_batched_tokens)
    num_blocks = args.num_blocks
    if num_blocks is None:
        if device.type == "cuda":  # what the largest step leaves (it runs once, here)
            num_blocks = kv_blocks(model, args.block_size, defaults)
        else:
            want = defaults.max_num_seqs * model.config.max_position_embeddings // args.block_size
            num_blocks = max(64, min(want, CPU_KV_BUDGET_BYTES // per_block))
    config = EngineConfig(
        max_num_seqs=defaults.max_num_seqs, max_waiting=args.max_waiting,
        block_size=args.block_size, num_blocks=num_blocks,
        max_num_batched_tokens=defaults.max_num_batched_tokens,
        max_model_len=model.config.max_position_embeddings,
        scheduling_policy=args.scheduling_policy, priority_aging_s=args.priority_aging_s,
        background_band=args.background_band,
        background_step_tokens=args.background_step_tokens,
    )
    engine = Engine(model, tokenizer, config, eos_token_ids=checkpoint.generation.eos_token_ids)
    return engine, checkpoint, num_blocks


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda, but torch sees no CUDA device", file=sys.stderr)
        return 2
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda" if use_cuda else "cpu")
    if use_cuda and args.weights != "auto":
        print(f"error: --weights {args.weights} is for CPU; on CUDA the engine runs bf16 "
              "(or fp16) weights, so leave --weights at auto", file=sys.stderr)
        return 2
    weights = None if args.weights == "fp32" else args.weights
    if use_cuda:
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    else:
        dtype = torch.float32
        # Without this, tiny activations turn denormal and CPU matmuls slow down ~20x.
        torch.set_flush_denormal(True)
    torch.set_num_threads(args.threads or max(1, min(os.cpu_count() or 1, 8)))
    try:
        # Built in a thread of its own that ends before serving: every OpenMP thread team
        # torch starts stays alive in its thread, and with more OpenMP threads alive than
        # cores libgomp stops spinning between parallel regions (GOMP_SPINCOUNT), which
        # slowed every decode step of the engine thread (docs/benchmarks.md). So no torch
        # work runs in the main thread, whose event loop only serves HTTP.
        with ThreadPoolExecutor(1, thread_name_prefix="load") as loader:
            engine, checkpoint, num_blocks = loader.submit(
                build_engine, args, device, dtype, weights).result()
    except ModelLoadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    name, model, generation = checkpoint.name, checkpoint.model, checkpoint.generation
    provider = tracer_provider_from_env()
    app = create_app(engine, model_name=name, tracer=install(provider), defaults=generation,
                     warm=True, idempotency=IdempotencyLimits(args.idempotency_ttl_s,
                                                              args.idempotency_max_answers))
    log.info("serving %s on http://%s:%d once warmed up (%s, %s weights, %d KV blocks of %d "
             "tokens; sampling defaults temperature %g, top_p %g)", name, args.host, args.port,
             device, weight_format(model), num_blocks, args.block_size, generation.temperature,
             generation.top_p)
    try:
        return asyncio.run(serve(app, args.host, args.port))
    finally:
        if provider is not None:
            provider.shutdown()


if __name__ == "__main__":
    sys.exit(main())
