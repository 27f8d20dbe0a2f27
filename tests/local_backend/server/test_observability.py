"""/metrics speaks vLLM's names; an inbound traceparent is continued with engine spans."""

from __future__ import annotations

import aiohttp

from tests.local_backend.server.conftest import ServeFactory

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


async def test_metrics_use_vllm_names_and_count_tokens(serve: ServeFactory) -> None:
    served = await serve()
    await served.client().completions.create(
        model="tiny", prompt="count me", max_tokens=5, extra_body={"ignore_eos": True})
    async with aiohttp.ClientSession() as http, http.get(
        str(served.server.make_url("/metrics"))
    ) as resp:
        text = await resp.text()
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc", "vllm:num_preemptions_total",
                 "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
                 "vllm:time_to_first_token_seconds_bucket",
                 "vllm:inter_token_latency_seconds_bucket", "vllm:request_queue_time_seconds_sum",
                 "vllm:request_prefill_time_seconds_sum", "vllm:request_decode_time_seconds_sum",
                 "vllm:request_inference_time_seconds_sum", "vllm:e2e_request_latency_seconds_sum"):
        assert name in text, name
    assert 'vllm:generation_tokens_total{model_name="tiny"} 5.0' in text
    assert 'vllm:inter_token_latency_seconds_count{model_name="tiny"} 4.0' in text


async def test_traceparent_is_continued_with_queue_prefill_and_decode_spans(
    serve: ServeFactory,
) -> None:
    served = await serve()
    await served.client().completions.create(
        model="tiny", prompt="trace me", max_tokens=4, extra_body={"ignore_eos": True},
        extra_headers={"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"},
    )
    spans = {s.name: s for s in served.spans.get_finished_spans()}
    root = spans["local_backend.request"]
    assert f"{root.context.trace_id:032x}" == TRACE_ID
    assert root.parent is not None and f"{root.parent.span_id:016x}" == PARENT_ID
    queue, prefill, decode = (spans[n] for n in ("engine.queue", "engine.prefill", "engine.decode"))
    for span in (queue, prefill, decode):
        assert span.parent is not None and span.parent.span_id == root.context.span_id
        assert span.context.trace_id == root.context.trace_id
    assert root.start_time == queue.start_time
    assert queue.end_time == prefill.start_time and prefill.end_time == decode.start_time
    assert root.end_time >= decode.end_time
    assert root.attributes["gen_ai.usage.output_tokens"] == 4
