"""Latency prediction and amortised cost, on plain numbers."""

from policies.load import loads
from routing.predict import TargetModel, estimate, predict, predicted_cost_micros
from routing.stats import LiveStats
from tests.routing.policies import BASE, policy

POLICY = policy()
LOCAL = TargetModel.of(POLICY.targets["local/llama"])  # 4 slots, 4000 tok/s prefill, 50 tok/s
SHARED = TargetModel.of(POLICY.targets["openai/gpt-4o-mini"])


def test_cold_start_prediction_uses_the_declared_priors() -> None:
    p = predict(LOCAL, 400, 100, LiveStats().snapshot().target(LOCAL.key), 0.0)
    assert p.ttft_ms == 2 + 100  # network + 400 tokens at 4000 tok/s
    assert p.total_ms == p.ttft_ms + 2000  # 100 tokens at 50 tok/s
    assert not p.measured and p.queue_ms == 0


def test_measurements_replace_priors() -> None:
    stats = LiveStats()
    stats.record_success(LOCAL.key, network_ms=10.0, ttft_ms=150.0, total_ms=1150.0,
                         output_tokens=101, explained_ttft_ms=110.0)
    p = predict(LOCAL, 400, 100, stats.snapshot().target(LOCAL.key), 0.0)
    assert p.measured
    assert p.ttft_ms == 10 + 100 + 40  # network + prefill + learnt overhead
    assert p.total_ms == p.ttft_ms + 1000  # measured 100 tok/s


def test_queue_wait_grows_once_slots_are_full() -> None:
    stats = LiveStats()
    waits = []
    for _ in range(6):
        waits.append(predict(LOCAL, 0, 100, stats.snapshot().target(LOCAL.key), 0.0).queue_ms)
        stats.request_started(LOCAL.key)
    assert waits[:4] == [0, 0, 0, 0]
    assert 0 < waits[4] < waits[5]


def test_a_model_with_its_own_smaller_limit_queues_at_that_limit() -> None:
    text = BASE.replace("context_tokens: 8192", "context_tokens: 8192\n        max_concurrency: 1")
    limited = loads(text.replace("{pii_action}", "local_only").replace(
        "{on_miss}", "fastest").replace("{objective}", "cheapest"))
    model = TargetModel.of(limited.targets["local/llama"])
    stats = LiveStats()
    assert predict(model, 0, 100, stats.snapshot().target(model.key), 0.0).queue_ms == 0
    stats.request_started(model.key)  # one running: the model's single slot is taken
    assert predict(model, 0, 100, stats.snapshot().target(model.key), 0.0).queue_ms > 0
    # the GPU still runs the backend's 4 at once: the amortised cost is unchanged
    assert predicted_cost_micros(model, 4000, 200, 50.0) == \
        predicted_cost_micros(LOCAL, 4000, 200, 50.0)


def test_backend_reported_waiting_counts_while_fresh() -> None:
    stats = LiveStats()
    stats.set_backend_load(LOCAL.key, 100.0, waiting=2, running=4)
    snap = stats.snapshot().target(LOCAL.key)
    assert predict(LOCAL, 0, 100, snap, 101.0).queue_ms > 0
    assert predict(LOCAL, 0, 100, snap, 1000.0).queue_ms == 0


def test_shared_cost_is_tokens_times_price_in_micro_dollars() -> None:
    assert predicted_cost_micros(SHARED, 1000, 1000, 100.0) == 150 + 600


def test_dedicated_cost_is_the_gpu_hour_spread_over_throughput() -> None:
    # $0.50/h = 138.9 µUSD/s; 4000 input tokens = 1 s prefill; 200 output tokens over
    # 4 streams at 50 tok/s = 1 s; 2 s of GPU.
    assert predicted_cost_micros(LOCAL, 4000, 200, 50.0) == 278
    assert predicted_cost_micros(LOCAL, 4000, 200, 100.0) < 278  # faster decode is cheaper


def test_the_hot_path_cost_agrees_with_the_cost_model() -> None:
    stats = LiveStats()
    stats.record_success(LOCAL.key, network_ms=3.0, ttft_ms=90.0, total_ms=2090.0,
                         output_tokens=161)
    for model in (LOCAL, SHARED):
        snap = stats.snapshot().target(model.key)
        decode = predict(model, 1234, 321, snap, 0.0).decode_tokens_per_s
        assert estimate(model, 1234, 321, snap, 0.0)[4] == \
            predicted_cost_micros(model, 1234, 321, decode)


def test_predicted_ttft_grows_with_the_gateways_queue_on_top_of_the_backends_own() -> None:
    stats = LiveStats()
    stats.set_backend_load(LOCAL.key, 0.0, waiting=2, running=4)
    ttfts = []
    for _ in range(3):
        ttfts.append(predict(LOCAL, 400, 100, stats.snapshot().target(LOCAL.key), 0.0).ttft_ms)
        stats.request_queued(LOCAL.key)
    assert ttfts[0] < ttfts[1] < ttfts[2]


def test_a_429s_retry_after_is_a_predicted_wait_not_an_exclusion() -> None:
    stats = LiveStats()
    stats.record_busy(SHARED.key, 10.0, retry_after_s=2.0)
    target = stats.snapshot().target(SHARED.key)
    assert predict(SHARED, 0, 1, target, 10.5).queue_ms == 1500.0
    assert predict(SHARED, 0, 1, target, 12.0).queue_ms == 0.0
