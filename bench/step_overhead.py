"""The engine's per-step time outside the model, at N decoding streams, under torch's profiler.

    .venv/bin/python bench/step_overhead.py [--model smollm2-135m-instruct|demo|PATH]
        [--streams 16] [--steps 64] [--threads 2] [--weights auto] [--num-blocks 1024]
        [--attention sdpa|flex|flex-compiled]

Runs the engine's own step (scheduler → model runner → sampler) in this process, no HTTP
and no engine thread, over `--streams` sequences that all decode. Each step is one
profiler step; the model's forward is marked by a record_function around it, so
"outside the model" is the step's wall time less the forward's (step preparation, the
attention metadata, the sampler and the scheduler).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
import typing
from pathlib import Path

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from local_backend.checkpoint import load_checkpoint  # noqa: E402
from local_backend.engine.loop import Engine, EngineConfig  # noqa: E402
from local_backend.engine.params import SamplingParams  # noqa: E402
from local_backend.engine.runner import Backend  # noqa: E402
from local_backend.engine.sequence import Sequence, Timings  # noqa: E402
from local_backend.model.llama import LlamaForCausalLM  # noqa: E402


class Timed(nn.Module):
    """The model's forward inside a record_function, its wall time kept per call."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.seconds: list[float] = []

    def forward(self, *args: object) -> torch.Tensor:
        start = time.perf_counter()
        with record_function("model_forward"):
            out = self.inner(*args)
        self.seconds.append(time.perf_counter() - start)
        return out

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The head counts as model time too (added to the step's forward time)."""
        start = time.perf_counter()
        with record_function("model_forward"):
            out = typing.cast(LlamaForCausalLM, self.inner).logits(hidden)
        self.seconds[-1] += time.perf_counter() - start
        return typing.cast(torch.Tensor, out)


def one_step(engine: Engine) -> None:
    """The engine thread's step without delivery: schedule, run, commit, sample, append."""
    batch = engine.scheduler.schedule(time.monotonic())
    logits, sampled = engine.runner.execute(batch.seqs, batch.num_new)
    for seq, n in zip(batch.seqs, batch.num_new, strict=True):
        seq.num_computed += n
        engine.blocks.commit(seq)
    chosen = [batch.seqs[i] for i in sampled]
    tokens, _ = engine.sampler.sample(logits, [s.request_id for s in chosen],
                                      [s.params for s in chosen], [s.output_ids for s in chosen])
    for seq, token in zip(chosen, tokens, strict=True):
        seq.output_ids.append(token)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--weights", default="auto")
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--attention", default="sdpa", choices=typing.get_args(Backend),
                        help="the runner's attention path")
    parser.add_argument("--num-blocks", type=int, default=1024, help="KV cache blocks")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    cache = Path(os.environ.get("ROUTEGATE_CACHE_DIR") or Path.home() / ".cache" / "routegate")
    weights = None if args.weights == "fp32" else args.weights
    checkpoint = load_checkpoint(args.model, cache, weights=weights)
    model = checkpoint.model
    config = EngineConfig(max_num_seqs=max(32, args.streams), num_blocks=args.num_blocks,
                          max_num_batched_tokens=4096, attention=args.attention)
    engine = Engine(model, checkpoint.tokenizer, config)
    timed = Timed(engine.runner.model)
    engine.runner.model = timed  # type: ignore[assignment]
    rng = random.Random(0)
    params = SamplingParams(max_tokens=10_000, temperature=0.0, ignore_eos=True)
    for i in range(args.streams):
        prompt = [rng.randrange(0, model.config.vocab_size) for _ in range(64)]
        engine.scheduler.add(Sequence(f"s{i}", prompt, params, Timings(arrival=0.0)))
    with torch.inference_mode():
        while any(s.num_computed < s.num_tokens - 1 or not s.output_ids
                  for s in engine.scheduler.running) or engine.scheduler.waiting:
            one_step(engine)  # prefill (and warm-up)
        for _ in range(4):
            one_step(engine)
        timed.seconds.clear()
        walls: list[float] = []
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(args.steps):
                start = time.perf_counter()
                with record_function("engine_step"):
                    one_step(engine)
                walls.append(time.perf_counter() - start)
    outside = [w - m for w, m in zip(walls, timed.seconds, strict=True)]
    events = {e.key: e for e in prof.key_averages()}
    outside_ops = sum(1 for e in prof.events()
                      if e.name.startswith("aten::") and e.cpu_parent is not None
                      and e.cpu_parent.name == "engine_step")
    print(f"{args.model} ({args.weights}), {args.streams} decoding streams, {args.threads} "
          f"threads, {args.steps} steps; load average {os.getloadavg()[0]:.2f}")
    print(f"  step wall        median {statistics.median(walls) * 1e3:8.2f} ms")
    print(f"  model forward    median {statistics.median(timed.seconds) * 1e3:8.2f} ms")
    print(f"  outside model    median {statistics.median(outside) * 1e3:8.2f} ms "
          f"(min {min(outside) * 1e3:.2f})")
    print(f"  top-level aten ops outside the model per step: {outside_ops / args.steps:.0f}; "
          f"profiler step total "
          f"{events['engine_step'].cpu_time_total / args.steps / 1e3:.2f} ms, forward "
          f"{events['model_forward'].cpu_time_total / args.steps / 1e3:.2f} ms")
    print("  most self CPU time per step:")
    for e in sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:10]:
        print(f"    {e.key:40} {e.self_cpu_time_total / args.steps / 1e3:8.3f} ms "
              f"{e.count / args.steps:6.0f} calls")
    return 0


if __name__ == "__main__":
    sys.exit(main())
