"""The engine: a thread that runs scheduler → model → sampler steps, and the asyncio face of it.

Requests enter through a thread-safe inbox; each step's new tokens go back to the
event loop in one `call_soon_threadsafe` per loop, into each request's own
asyncio queue. Nothing here blocks the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import queue
import threading
import time
import typing
from collections.abc import AsyncIterator, Callable

from local_backend.engine.block_manager import BlockManager
from local_backend.engine.interface import EngineConfig as EngineConfig
from local_backend.engine.interface import EngineStats as EngineStats
from local_backend.engine.interface import QueueFull as QueueFull
from local_backend.engine.interface import RequestOutput as RequestOutput
from local_backend.engine.interface import RequestRejected as RequestRejected
from local_backend.engine.params import SamplingParams
from local_backend.engine.prefix_events import PrefixEvents
from local_backend.engine.priority import SchedulingPolicy
from local_backend.engine.runner import ModelRunner
from local_backend.engine.sampler import Sampler, TokenLogprob
from local_backend.engine.scheduler import Scheduler
from local_backend.engine.sequence import Sequence, Timings
from local_backend.model.llama import LlamaForCausalLM
from local_backend.tokenizer import Detokenizer, Tokenizer

log = logging.getLogger(__name__)


_Sink = tuple[asyncio.AbstractEventLoop, "asyncio.Queue[RequestOutput]"]
_Delivery = tuple["asyncio.Queue[RequestOutput]", RequestOutput]


class Engine:
    def __init__(
        self,
        model: LlamaForCausalLM,
        tokenizer: Tokenizer,
        config: EngineConfig,
        *,
        eos_token_ids: tuple[int, ...] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.clock = clock
        self.prefix_events = PrefixEvents()
        self.blocks = BlockManager(
            config.num_blocks, config.block_size, prefix_caching=config.prefix_caching,
            events=self.prefix_events,
        )
        # A sequence alone must always fit in the cache, or it could never be rescheduled.
        fits = (config.num_blocks - self.blocks.watermark) * config.block_size
        self.max_model_len = min(config.max_model_len, model.config.max_position_embeddings, fits)
        self.scheduler = Scheduler(
            self.blocks,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            policy=SchedulingPolicy(config.scheduling_policy, config.priority_aging_s,
                                    config.background_band, config.background_step_tokens),
        )
        self.runner = ModelRunner(
            model, num_blocks=config.num_blocks, block_size=config.block_size,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens, attention=config.attention,
            cuda_graphs=config.cuda_graphs, max_model_len=self.max_model_len)
        self.sampler = Sampler()
        self._inbox: queue.SimpleQueue[tuple[str, object]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._pending = 0  # added but not yet seen by the engine thread
        self._sinks: dict[str, _Sink] = {}
        self._seqs: dict[str, Sequence] = {}
        self._detok: dict[str, Detokenizer] = {}
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._aborted = 0

    # ---- event-loop side -------------------------------------------------------------
    def start(self) -> None:
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def stats(self) -> EngineStats:
        return EngineStats(
            running=len(self.scheduler.running),
            waiting=len(self.scheduler.waiting) + self._pending,
            kv_usage=self.blocks.usage,
            free_blocks=self.blocks.num_free,
            num_blocks=self.blocks.num_blocks,
            preemptions=self.scheduler.num_preemptions,
            aborted=self._aborted,
            prefix_cache_queries=self.blocks.cache_queries,
            prefix_cache_hits=self.blocks.cache_hits,
            bands=self.scheduler.band_stats(),
        )

    def add_request(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams,
        *,
        arrival: float | None = None,
        deadline: float | None = None,
        priority: int = 1,
        cache_salt: str | None = None,
        prefix_tags: tuple[tuple[int, int], ...] = (),
    ) -> asyncio.Queue[RequestOutput]:
        """Queue a request; its outputs arrive on the returned queue. Call from the event loop.
        `deadline` (engine clock): when nobody waits for the answer any more; a sequence
        still queued then, or one that could not finish by then at the engine's pace, is
        dropped before its prefill, a running one stops at that step, all with
        finish_reason "deadline". `priority`: its band, lower first (priority.py).
        `prefix_tags`: the client's names for prefixes of the prompt (prefix_events.py)."""
        if not prompt_ids:
            raise RequestRejected("the prompt is empty")
        if len(prompt_ids) >= self.max_model_len:
            raise RequestRejected(
                f"the prompt has {len(prompt_ids)} tokens; this server's context "
                f"(model and KV cache) is {self.max_model_len} tokens"
            )
        with self._lock:
            if (len(self.scheduler.waiting) + self._pending >= self.config.max_waiting
                    and not self.scheduler.outranks_waiting(priority)):
                raise QueueFull(f"{self.config.max_waiting} requests are already waiting")
            self._pending += 1
        max_tokens = min(params.max_tokens, self.max_model_len - len(prompt_ids))
        stop_ids = params.stop_token_ids or self.eos_token_ids
        params = dataclasses.replace(params, max_tokens=max_tokens, stop_token_ids=stop_ids)
        seq = Sequence(request_id, list(prompt_ids), params,
                       Timings(arrival=self.clock() if arrival is None else arrival),
                       deadline=deadline, priority=priority, cache_salt=cache_salt,
                       prefix_tags=prefix_tags)
        # Unbounded in type only: it holds at most one output per step, max_tokens + 1 in all.
        out: asyncio.Queue[RequestOutput] = asyncio.Queue()
        self._inbox.put(("add", (seq, (asyncio.get_running_loop(), out))))
        self._wake.set()
        return out

    def abort(self, request_id: str) -> None:
        self._inbox.put(("abort", request_id))
        self._wake.set()

    async def generate(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams,
        *,
        arrival: float | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Outputs until the final one; leaving early (cancel, disconnect) aborts the request."""
        outputs = self.add_request(request_id, prompt_ids, params, arrival=arrival)
        finished = False
        try:
            while not finished:
                output = await outputs.get()
                finished = output.finished
                yield output
        finally:
            if not finished:
                self.abort(request_id)

    # ---- engine thread ---------------------------------------------------------------
    def _run(self) -> None:
        while not self._stopping:
            self._drain_inbox()
            if not self.scheduler.has_work():
                self._wake.wait()
                self._wake.clear()
                continue
            try:
                self._step()
            except Exception:  # a task supervisor: fail the requests, keep serving
                log.exception("engine step failed; failing the requests in flight")
                self._end_all("error")
        self._drain_inbox()
        self._end_all("shutdown")  # nobody waits forever on an engine that stopped

    def _end_all(self, reason: str) -> None:
        for seq in [*self.scheduler.running, *self.scheduler.waiting]:
            self._finish(seq, reason, self.clock())
        self._flush([self._final_output(s) for s in list(self._seqs.values())])
        self._forget_finished()

    def _drain_inbox(self) -> None:
        while True:
            try:
                kind, payload = self._inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "add":
                seq, sink = typing.cast(tuple[Sequence, _Sink], payload)
                self._seqs[seq.request_id] = seq
                self._sinks[seq.request_id] = sink
                self._detok[seq.request_id] = Detokenizer(self.tokenizer, seq.prompt_ids)
                self.scheduler.add(seq)
                with self._lock:
                    self._pending -= 1
            elif kind == "abort":
                aborted = self._seqs.get(str(payload))
                if aborted is not None and not aborted.is_finished:
                    self._finish(aborted, "abort", self.clock())
                    self._aborted += 1
                    self._forget(aborted.request_id)

    def _step(self) -> None:
        now = self.clock()
        self._expire(now)
        batch = self.scheduler.schedule(now)
        if not batch.seqs:
            time.sleep(0.001)  # nothing fits this instant; blocks free up as others finish
            return
        logits, sampled = self.runner.execute(batch.seqs, batch.num_new)
        for seq, n in zip(batch.seqs, batch.num_new, strict=True):
            seq.num_computed += n
            self.blocks.commit(seq)
        chosen = [batch.seqs[i] for i in sampled]
        tokens, logprobs = self.sampler.sample(
            logits, [s.request_id for s in chosen], [s.params for s in chosen],
            [s.output_ids for s in chosen],
        )
        t = self.clock()
        outputs = [
            self._append(seq, token, lp, t)
            for seq, token, lp in zip(chosen, tokens, logprobs, strict=True)
        ]
        if not batch.background:  # the pace of interactive work, which deadlines need
            self.scheduler.pace.stepped(t - now)
        self._flush(outputs)
        self._forget_finished()

    def _expire(self, now: float) -> None:
        """End the sequences whose deadline has passed or cannot be met, then those a
        better band pushed out of a full queue ("shed"): no step is spent on them."""
        ended = self.scheduler.overdue(now)
        for seq in ended:
            self._finish(seq, "deadline", now)
        shed = self.scheduler.shed(self.config.max_waiting)
        for seq in shed:
            self._finish(seq, "shed", now)
        if ended or shed:
            self._flush([self._final_output(seq) for seq in (*ended, *shed)])
            self._forget_finished()

    def _append(
        self, seq: Sequence, token: int, lp: TokenLogprob | None, t: float
    ) -> RequestOutput:
        params = seq.params
        seq.output_ids.append(token)
        if seq.timings.first_token is None:
            seq.timings.first_token = t
        seq.timings.last_token = t
        detok = self._detok[seq.request_id]
        before = len(seq.text)
        reason: str | None = None
        if token in params.stop_token_ids and not params.ignore_eos:
            reason = "stop"
            seq.text += detok.flush()
        else:
            seq.text += detok.add(token)
            if len(seq.output_ids) >= params.max_tokens:
                reason = "length"
                seq.text += detok.flush()
        logprobs = [lp] if lp is not None else []
        cut = -1
        if params.stop:
            # Only a match that ends in the new text is new: search from just before it.
            start = max(0, before - max(len(s) for s in params.stop) + 1)
            found = (i for s in params.stop if (i := seq.text.find(s, start)) >= 0)
            cut = min(found, default=-1)
            if cut >= 0:
                seq.text, reason = seq.text[:cut], "stop"
        hold = 0 if reason else max((len(s) for s in params.stop), default=1) - 1
        upto = max(seq.emitted_chars, len(seq.text) - hold)
        delta = seq.text[seq.emitted_chars : upto]
        seq.emitted_chars = upto
        if params.stop and params.logprobs is not None:
            # Logprobs go out with their text: the text after a cut is never sent, nor
            # are the logprobs of the tokens that began there.
            frontier = upto if reason is None else cut if cut >= 0 else len(seq.text) + 1
            logprobs = _release_logprobs(seq, before, logprobs, frontier)
        if reason is not None:
            self._finish(seq, reason, t)
        return RequestOutput(
            seq.request_id, delta, [token], t, finished=reason is not None,
            finish_reason=reason, logprobs=logprobs, **self._counts(seq),
        )

    def _counts(self, seq: Sequence) -> dict[str, typing.Any]:
        return {
            "prompt_tokens": len(seq.prompt_ids),
            "cached_tokens": seq.num_cached,
            "completion_tokens": len(seq.output_ids),
            "preemptions": seq.preemptions,
            "timings": seq.timings if seq.is_finished else None,
        }

    def _final_output(self, seq: Sequence) -> RequestOutput:
        return RequestOutput(
            seq.request_id, "", [], self.clock(), finished=True,
            finish_reason=seq.finish_reason, **self._counts(seq),
        )

    def _finish(self, seq: Sequence, reason: str, t: float) -> None:
        if reason in ("stop", "length"):
            self.scheduler.pace.finished(len(seq.output_ids))
        self.scheduler.finish(seq, reason)
        seq.timings.finished = t
        self.sampler.forget(seq.request_id)

    def _forget(self, request_id: str) -> None:
        self._seqs.pop(request_id, None)
        self._sinks.pop(request_id, None)
        self._detok.pop(request_id, None)

    def _forget_finished(self) -> None:
        for request_id in [r for r, s in self._seqs.items() if s.is_finished]:
            self._forget(request_id)

    def _flush(self, outputs: list[RequestOutput]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[_Delivery]] = {}
        for output in outputs:
            sink = self._sinks.get(output.request_id)
            if sink is not None:
                by_loop.setdefault(sink[0], []).append((sink[1], output))
        for loop, items in by_loop.items():
            with contextlib.suppress(RuntimeError):  # that loop has closed: nobody listens
                loop.call_soon_threadsafe(_deliver, items)


def _deliver(items: list[_Delivery]) -> None:
    for sink, output in items:
        sink.put_nowait(output)


def _release_logprobs(
    seq: Sequence, start: int, new: list[TokenLogprob], frontier: int,
) -> list[TokenLogprob]:
    """Hold `new` (the logprobs of a token whose text starts at `start`) with the rest,
    and hand out those of the tokens that start before `frontier`, in order."""
    seq.held_logprobs.extend((start, lp) for lp in new)
    released = 0
    while released < len(seq.held_logprobs) and seq.held_logprobs[released][0] < frontier:
        released += 1
    out = [lp for _, lp in seq.held_logprobs[:released]]
    del seq.held_logprobs[:released]
    return out
