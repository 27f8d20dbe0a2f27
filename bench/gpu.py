"""The engine on a CUDA device beside transformers' `generate` (static batching), same model.

    python bench/gpu.py [--models qwen2.5-0.5b llama-3.2-1b] [--streams 1 16 64 256]
        [--prompt 512] [--new 128] [--attention sdpa] [--cuda-graphs] [--json PATH]

Models are random-weight (bf16) at the shapes of Qwen2.5-0.5B and Llama-3.2-1B, their
configs written below: nothing is downloaded (the device machine has no network).
Every request has `--prompt` random token ids and generates exactly `--new` tokens
(greedy, EOS ignored). For each model and stream count:

- engine: all requests added at once to one `Engine` (in this process, no HTTP);
  output tok/s over the wall time, TTFT p50/p95 from arrival, time per output token
  (each request's (last − first token) / (new − 1), averaged);
- transformers: one `generate` call over the whole batch (static batching: every
  request starts together and the batch ends with its longest), same prompts and
  lengths; output tok/s, and TTFT as the time of a `max_new_tokens=1` call;
- at batch 1, the engine's bandwidth use: bytes a decode step must read (every weight
  but the embedding table, plus the KV cache of the context) per step time, over the
  device's HBM bandwidth.

Checks (issue 36): engine ≥ 3× transformers at 64 streams; batch-1 decode ≥ 50 % of
the bandwidth bound.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import typing
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from local_backend.demo import write_tokenizer  # noqa: E402
from local_backend.engine.loop import Engine, EngineConfig  # noqa: E402
from local_backend.engine.params import SamplingParams  # noqa: E402
from local_backend.engine.runner import Backend  # noqa: E402
from local_backend.model.config import LlamaConfig  # noqa: E402
from local_backend.model.llama import LlamaForCausalLM  # noqa: E402
from local_backend.tokenizer import Tokenizer  # noqa: E402

# The checkpoints' own config.json fields that shape the compute (weights are random).
CONFIGS: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": {
        "model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896,
        "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
        "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "max_position_embeddings": 32768, "tie_word_embeddings": True,
        "eos_token_id": 151643,
    },
    "llama-3.2-1b": {
        "model_type": "llama", "vocab_size": 128256, "hidden_size": 2048,
        "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 64, "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0, "max_position_embeddings": 131072,
        "tie_word_embeddings": True, "eos_token_id": 128001,
        "rope_scaling": {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    },
}
# HBM bandwidth by device name (bytes/s), for the batch-1 bound.
HBM_BYTES_S = {"H200": 4.8e12, "H100 SXM": 3.35e12, "H100 NVL": 3.9e12, "H100 PCIe": 2.0e12,
               "H100": 3.35e12, "A100-SXM4-80GB": 2.04e12, "A100": 1.56e12, "L40S": 0.864e12}


def hbm_bandwidth() -> float | None:
    name = torch.cuda.get_device_name()
    return next((bw for key, bw in HBM_BYTES_S.items() if key in name), None)


def shrunk(config: dict[str, Any]) -> dict[str, Any]:
    """`--smoke`: the same architecture at toy sizes, to try the script on a CPU."""
    return {**config, "vocab_size": 512, "hidden_size": 128, "intermediate_size": 256,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 32, "eos_token_id": 1}


def random_model(config: dict[str, Any], device: str, dtype: torch.dtype) -> LlamaForCausalLM:
    """The engine's model at `config`'s shapes, weights N(0, 0.02)."""
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(LlamaConfig.from_dict(config))
    model = model.to(dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)
    return model.eval()


def prompts(count: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (count, length), generator=g).tolist()


async def engine_run(engine: Engine, batch: list[list[int]], new: int) -> dict[str, float]:
    params = SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True)
    start = engine.clock()

    async def one(i: int, ids: list[int]) -> tuple[float, float, int]:
        first = last = 0.0
        count = 0
        async for out in engine.generate(f"r{i}-{start}", ids, params, arrival=start):
            if out.token_ids:
                last = out.time
                first = first or last
                count += len(out.token_ids)
        return first - start, last - first, count

    results = await asyncio.gather(*(one(i, ids) for i, ids in enumerate(batch)))
    wall = engine.clock() - start
    ttfts = sorted(r[0] for r in results)
    return {"tok_s": sum(r[2] for r in results) / wall,
            "ttft_p50_ms": 1e3 * statistics.median(ttfts),
            "ttft_p95_ms": 1e3 * ttfts[min(len(ttfts) - 1, round(0.95 * (len(ttfts) - 1)))],
            "tpot_ms": 1e3 * statistics.mean(r[1] / max(1, r[2] - 1) for r in results)}


def bytes_per_decode_step(model: LlamaForCausalLM, context: int) -> int:
    weights = sum(p.numel() * p.element_size() for n, p in model.named_parameters()
                  if "embed_tokens" not in n)
    if model.config.tie_word_embeddings:  # the head reads the shared table once
        weights += model.config.vocab_size * model.config.hidden_size * 2
    c = model.config
    kv = 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * 2 * context
    return weights + kv


def hf_model(config: dict[str, Any], device: str, dtype: torch.dtype) -> Any:
    import transformers

    hf_config = transformers.AutoConfig.for_model(**config)
    torch.manual_seed(0)
    with torch.device(device):  # initialised where it runs: seconds, not a CPU minute
        model = transformers.AutoModelForCausalLM.from_config(hf_config, dtype=dtype)
    return model.eval()


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


@torch.inference_mode()
def hf_run(model: Any, batch: list[list[int]], new: int) -> dict[str, float]:
    ids = torch.tensor(batch, device=model.device)
    mask = torch.ones_like(ids)
    kwargs = {"attention_mask": mask, "do_sample": False, "pad_token_id": 0,
              "eos_token_id": None}
    synchronize()
    t0 = time.perf_counter()
    model.generate(ids, max_new_tokens=1, min_new_tokens=1, **kwargs)
    synchronize()
    ttft = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = model.generate(ids, max_new_tokens=new, min_new_tokens=new, **kwargs)
    synchronize()
    wall = time.perf_counter() - t0
    produced = (out.shape[1] - ids.shape[1]) * ids.shape[0]
    return {"tok_s": produced / wall, "ttft_p50_ms": 1e3 * ttft, "ttft_p95_ms": 1e3 * ttft,
            "tpot_ms": 1e3 * (wall - ttft) / max(1, new - 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--attention", default="sdpa", choices=typing.get_args(Backend))
    parser.add_argument("--cuda-graphs", action="store_true",
                        help="replay decode steps from CUDA graphs (engine/cuda_graphs.py)")
    parser.add_argument("--no-baseline", action="store_true", help="skip transformers")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--smoke", action="store_true",
                        help="toy sizes on the CPU in fp32: checks the script, measures nothing")
    args = parser.parse_args()
    if args.smoke:
        device, dtype, bandwidth, label = "cpu", torch.float32, None, "CPU (smoke run)"
    elif torch.cuda.is_available():
        device, dtype, label = "cuda", torch.bfloat16, torch.cuda.get_device_name()
        bandwidth = hbm_bandwidth()
    else:
        print("bench/gpu.py needs a CUDA device (or --smoke)", file=sys.stderr)
        return 2
    print(f"{label}, torch {torch.__version__}, {args.prompt} in / {args.new} out, "
          f"attention {args.attention}, CUDA graphs {'on' if args.cuda_graphs else 'off'}")
    tokenizer_dir = Path(tempfile.mkdtemp())
    write_tokenizer(tokenizer_dir)  # ids past its byte vocabulary detokenise to nothing
    tokenizer = Tokenizer.from_dir(tokenizer_dir)
    figures: dict[str, Any] = {"device": label, "models": {}}
    for name in args.models:
        config = shrunk(CONFIGS[name]) if args.smoke else CONFIGS[name]
        model = random_model(config, device, dtype)
        largest = max(args.streams)
        blocks = largest * -(-(args.prompt + args.new) // 16) + 64
        engine = Engine(model, tokenizer, EngineConfig(
            max_num_seqs=largest, max_waiting=largest, num_blocks=blocks,
            max_num_batched_tokens=8192, max_model_len=args.prompt + args.new + 16,
            attention=args.attention, cuda_graphs=args.cuda_graphs))
        engine.start()
        rows: dict[int, dict[str, Any]] = {}
        try:
            asyncio.run(engine_run(engine, prompts(2, 32, config["vocab_size"], 0), 8))  # warm
            for streams in args.streams:
                batch = prompts(streams, args.prompt, config["vocab_size"], streams)
                rows[streams] = {"engine": asyncio.run(engine_run(engine, batch, args.new))}
        finally:
            engine.stop()
        one = rows.get(1, {}).get("engine")
        if one is not None and bandwidth is not None:
            step_bytes = bytes_per_decode_step(model, args.prompt + args.new // 2)
            one["bandwidth_use"] = step_bytes / (one["tpot_ms"] / 1e3) / bandwidth
        del engine, model
        if device == "cuda":
            torch.cuda.empty_cache()
        if not args.no_baseline:
            hf = hf_model(config, device, dtype)
            hf_run(hf, prompts(2, 32, config["vocab_size"], 0), 8)  # warm-up
            for streams in args.streams:
                batch = prompts(streams, args.prompt, config["vocab_size"], streams)
                rows[streams]["transformers"] = hf_run(hf, batch, args.new)
            del hf
            if device == "cuda":
                torch.cuda.empty_cache()
        figures["models"][name] = rows
        report(name, rows)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    return 0


def report(name: str, rows: dict[int, dict[str, Any]]) -> None:
    print(f"\n{name}")
    print(f"{'':28}{'tok/s':>10}{'TTFT p50 ms':>13}{'p95 ms':>9}{'ms/token':>10}")
    for streams, sides in rows.items():
        for side, row in sides.items():
            print(f"{f'{side}, {streams} streams':28}{row['tok_s']:10.1f}"
                  f"{row['ttft_p50_ms']:13.1f}{row['ttft_p95_ms']:9.1f}{row['tpot_ms']:10.2f}")
    checks = []
    at64 = rows.get(64, {})
    if "transformers" in at64:
        checks.append(("tok/s at 64 streams ≥ 3× transformers",
                       at64["engine"]["tok_s"] / at64["transformers"]["tok_s"], 3.0))
    use = rows.get(1, {}).get("engine", {}).get("bandwidth_use")
    if use is not None:
        checks.append(("batch-1 decode ≥ 50 % of the HBM bound", use, 0.5))
    for label, value, bound in checks:
        print(f"  {label:42} {value:6.2f}  {'ok' if value >= bound else 'MISSED'}")


if __name__ == "__main__":
    sys.exit(main())
