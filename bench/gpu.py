"""The engine on a CUDA device beside transformers' `generate` (static batching), same model.

    python bench/gpu.py [--models qwen2.5-0.5b llama-3.2-1b] [--streams 1 16 64 256]
        [--prompt 512] [--new 128] [--variants sdpa sdpa+graphs flex-compiled]
        [--no-baseline] [--json PATH] [--smoke]

Models are random-weight (bf16) at the shapes of Qwen2.5-0.5B and Llama-3.2-1B, their
configs written below: nothing is downloaded (the device machine has no network).
Every request has `--prompt` random token ids and generates exactly `--new` tokens
(greedy, EOS ignored). For each model, engine variant and stream count:

- engine: all requests added at once to one `Engine` (in this process, no HTTP), one
  engine per variant (`sdpa` eager, `sdpa+graphs` decode steps from CUDA graphs, ...);
  output tok/s over the wall time, TTFT p50/p95 from arrival, time per output token
  (each request's (last − first token) / (new − 1), averaged);
- transformers: one `generate` call over the whole batch (static batching: every
  request starts together and the batch ends with its longest), same prompts and
  lengths; output tok/s, and TTFT as the time of a `max_new_tokens=1` call;
- at batch 1, the engine's bandwidth use: bytes a decode step must read (every weight
  but the embedding table, plus the KV cache of the context) per step time, over the
  device's HBM bandwidth (the datasheet's; a 2 GiB device copy's rate is printed too).

Each variant runs in its own try: one that fails is reported and the rest still run.
With --json the figures are written after every row, so a run cut short keeps them.

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
import traceback
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


def variant_config(variant: str) -> tuple[Backend, bool]:
    """"sdpa", "flex", "flex-compiled", each optionally "+graphs" (decode from CUDA graphs)."""
    attention, _, extra = variant.partition("+")
    if attention not in typing.get_args(Backend) or extra not in ("", "graphs"):
        raise argparse.ArgumentTypeError(f"unknown variant {variant!r}")
    return typing.cast(Backend, attention), extra == "graphs"


def copy_bandwidth() -> float:
    """Bytes/s a device-to-device copy of 2 GiB moves (read + written): the HBM in practice."""
    src = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        dst.copy_(src)
    synchronize()
    return 2 * 10 * src.numel() / (time.perf_counter() - t0)


def engine_rows(model: LlamaForCausalLM, tokenizer: Tokenizer, config: dict[str, Any],
                variant: str, args: argparse.Namespace) -> dict[int, dict[str, float]]:
    attention, graphs = variant_config(variant)
    largest = max(args.streams)
    blocks = largest * -(-(args.prompt + args.new) // 16) + 64
    engine = Engine(model, tokenizer, EngineConfig(
        max_num_seqs=largest, max_waiting=largest, num_blocks=blocks,
        max_num_batched_tokens=8192, max_model_len=args.prompt + args.new + 16,
        attention=attention, cuda_graphs=graphs))
    engine.start()
    rows: dict[int, dict[str, float]] = {}
    try:
        asyncio.run(engine_run(engine, prompts(2, 32, config["vocab_size"], 0), 8))  # warm
        for streams in args.streams:
            batch = prompts(streams, args.prompt, config["vocab_size"], streams)
            rows[streams] = asyncio.run(engine_run(engine, batch, args.new))
    finally:
        engine.stop()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--variants", nargs="+", default=["sdpa", "sdpa+graphs"],
                        help="engine paths: sdpa, flex, flex-compiled, each optionally "
                             "+graphs (decode steps replayed from CUDA graphs)")
    parser.add_argument("--no-baseline", action="store_true", help="skip transformers")
    parser.add_argument("--json", type=Path, help="also write the figures here, as they come")
    parser.add_argument("--smoke", action="store_true",
                        help="toy sizes on the CPU in fp32: checks the script, measures nothing")
    args = parser.parse_args()
    for variant in args.variants:
        variant_config(variant)
    if args.smoke:
        device, dtype, bandwidth, label = "cpu", torch.float32, None, "CPU (smoke run)"
    elif torch.cuda.is_available():
        device, dtype, label = "cuda", torch.bfloat16, torch.cuda.get_device_name()
        bandwidth = hbm_bandwidth()
    else:
        print("bench/gpu.py needs a CUDA device (or --smoke)", file=sys.stderr)
        return 2
    print(f"{label}, torch {torch.__version__}, {args.prompt} in / {args.new} out, "
          f"engine variants {', '.join(args.variants)}")
    figures: dict[str, Any] = {"device": label, "torch": torch.__version__,
                               "prompt": args.prompt, "new": args.new, "models": {}}
    if device == "cuda":
        figures["copy_bytes_s"] = copy_bandwidth()
        figures["datasheet_bytes_s"] = bandwidth
        print(f"device-to-device copy: {figures['copy_bytes_s'] / 1e12:.2f} TB/s "
              f"(datasheet {bandwidth and bandwidth / 1e12} TB/s)")

    def save() -> None:  # after every row: a run cut short still leaves what it measured
        if args.json:
            args.json.write_text(json.dumps(figures, indent=1))

    tokenizer_dir = Path(tempfile.mkdtemp())
    write_tokenizer(tokenizer_dir)  # ids past its byte vocabulary detokenise to nothing
    tokenizer = Tokenizer.from_dir(tokenizer_dir)
    for name in args.models:
        config = shrunk(CONFIGS[name]) if args.smoke else CONFIGS[name]
        model = random_model(config, device, dtype)
        sides: dict[str, dict[int, dict[str, float]]] = {}
        figures["models"][name] = sides
        step_bytes = bytes_per_decode_step(model, args.prompt + args.new // 2)
        for variant in args.variants:
            try:
                sides[f"engine {variant}"] = rows = engine_rows(
                    model, tokenizer, config, variant, args)
            except Exception as exc:  # the other variants and the baseline still run
                traceback.print_exc()
                sides[f"engine {variant}"] = {0: {"error": repr(exc)}}  # type: ignore[dict-item]
                continue
            if 1 in rows and bandwidth is not None:
                rows[1]["bandwidth_use"] = step_bytes / (rows[1]["tpot_ms"] / 1e3) / bandwidth
            save()
        del model
        if device == "cuda":
            torch.cuda.empty_cache()
        if not args.no_baseline:
            hf = hf_model(config, device, dtype)
            hf_run(hf, prompts(2, 32, config["vocab_size"], 0), 8)  # warm-up
            sides["transformers"] = {}
            for streams in args.streams:
                batch = prompts(streams, args.prompt, config["vocab_size"], streams)
                sides["transformers"][streams] = hf_run(hf, batch, args.new)
                save()
            del hf
            if device == "cuda":
                torch.cuda.empty_cache()
        report(name, sides)
    save()
    return 0


def report(name: str, sides: dict[str, dict[int, dict[str, float]]]) -> None:
    print(f"\n{name}")
    print(f"{'':34}{'tok/s':>10}{'TTFT p50 ms':>13}{'p95 ms':>9}{'ms/token':>10}")
    for side, rows in sides.items():
        for streams, row in rows.items():
            if "error" in row:
                print(f"{side:34}failed: {row['error']}")
                continue
            print(f"{f'{side}, {streams} streams':34}{row['tok_s']:10.1f}"
                  f"{row['ttft_p50_ms']:13.1f}{row['ttft_p95_ms']:9.1f}{row['tpot_ms']:10.2f}")
    baseline = sides.get("transformers", {}).get(64)
    for side, rows in sides.items():
        if not side.startswith("engine") or 0 in rows:
            continue
        if baseline is not None and 64 in rows:
            ratio = rows[64]["tok_s"] / baseline["tok_s"]
            print(f"  {side}: tok/s at 64 streams ≥ 3× transformers: {ratio:5.2f}  "
                  f"{'ok' if ratio >= 3 else 'MISSED'}")
        use = rows.get(1, {}).get("bandwidth_use")
        if use is not None:
            print(f"  {side}: batch-1 decode ≥ 50 % of the HBM bound: {use:5.2f}  "
                  f"{'ok' if use >= 0.5 else 'MISSED'}")


if __name__ == "__main__":
    sys.exit(main())
