"""Queue limits come from the policy and follow its reloads."""

import pytest

from gateway.queueing import BackendQueues
from policies.load import Policy, loads
from tests.gateway.queueing.harness import Harness, ManualClock, settle


def policy(local_limit: int | None) -> Policy:
    limit = f"max_concurrency: {local_limit}" if local_limit else ""
    return loads(f"""
version: 1
backends:
  local:
    type: openai
    url: http://127.0.0.1:9/v1
    deployment: dedicated
    {limit}
    models:
      demo: {{priors: {{network_ms: 10, ttft_ms: 90, decode_tokens_per_s: 64}}}}
  shared:
    type: openai
    url: http://127.0.0.1:10/v1
    models:
      gpt: {{}}
""", environ={})


def test_backend_max_concurrency_becomes_its_queue_limit() -> None:
    queues = BackendQueues.from_policy(policy(4))
    assert queues.snapshot("local").limit == 4
    assert queues.snapshot("shared").limit is None


def test_prior_hold_time_comes_from_declared_latency_priors() -> None:
    queues = BackendQueues.from_policy(policy(4))
    # 10 ms network + 90 ms to first token + 256 tokens at 64 tokens/s
    assert queues.snapshot("local").mean_service_s == pytest.approx(0.1 + 4.0)


def test_a_target_waits_in_its_backends_queue() -> None:
    loaded = policy(4)
    queues = BackendQueues.from_policy(loaded)
    assert queues.queue_key(loaded.targets["local/demo"]) == "local"


def test_a_target_with_its_own_limit_waits_in_its_own_queue() -> None:
    loaded = policy(4)
    queues = BackendQueues.from_policy(loaded)
    queues.set_limit("local/demo", 2)  # e.g. what that model's engine reports
    assert queues.queue_key(loaded.targets["local/demo"]) == "local/demo"


async def test_reloaded_policy_with_a_higher_limit_serves_waiters_at_once(
        clock: ManualClock) -> None:
    queues = BackendQueues(clock=clock)
    queues.apply_policy(policy(1))
    h = Harness(queues, "local")
    await h.arrive_all("a", "b", "c")
    assert h.granted == ["a"]
    queues.apply_policy(policy(3))
    await settle()
    assert h.granted == ["a", "b", "c"]


async def test_reloaded_policy_without_a_limit_stops_queueing(clock: ManualClock) -> None:
    queues = BackendQueues(clock=clock)
    queues.apply_policy(policy(1))
    h = Harness(queues, "local")
    await h.arrive_all("a", "b")
    queues.apply_policy(policy(None))
    await h.arrive_all("c")
    assert h.granted == ["a", "b", "c"]


def test_a_model_with_its_own_max_concurrency_gets_its_own_queue() -> None:
    loaded = loads("""
version: 1
backends:
  local:
    type: openai
    url: http://127.0.0.1:9/v1
    max_concurrency: 8
    models:
      big: {max_concurrency: 2}
      small: {}
""", environ={})
    queues = BackendQueues.from_policy(loaded)
    assert queues.queue_key(loaded.targets["local/big"]) == "local/big"
    assert queues.snapshot("local/big").limit == 2
    assert queues.queue_key(loaded.targets["local/small"]) == "local"


async def test_tenant_queue_weights_come_from_the_policy(clock: ManualClock) -> None:
    loaded = loads("""
version: 1
backends:
  local: {type: openai, url: "http://127.0.0.1:9/v1", max_concurrency: 1, models: {demo: {}}}
tenants:
  gold: {queue_weight: 3}
  bronze: {}
""", environ={})
    queues = BackendQueues(clock=clock)
    queues.apply_policy(loaded)
    h = Harness(queues, "local")
    await h.arrive_all("holder")
    for i in range(20):
        h.arrive(f"gold-{i}", tenant="gold")
        h.arrive(f"bronze-{i}", tenant="bronze")
    await settle()
    await h.finish("holder")
    while len(h.granted) < 21:  # each finished slot goes straight to the next waiter
        await h.finish(h.granted[-1])
    served = [label.split("-")[0] for label in h.granted[1:21]]
    # Weight 3 against 1: gold gets three of every four slots.
    assert served.count("gold") == 15


def model_limit_policy(model_limit: int | None) -> Policy:
    limit = f"{{max_concurrency: {model_limit}}}" if model_limit else "{}"
    return loads(f"""
version: 1
backends:
  local:
    type: openai
    url: http://127.0.0.1:9/v1
    max_concurrency: 8
    models:
      big: {limit}
""", environ={})


async def test_reloaded_policy_without_a_models_limit_sends_it_back_to_its_backends_queue(
        clock: ManualClock) -> None:
    queues = BackendQueues(clock=clock)
    queues.apply_policy(model_limit_policy(1))
    target = model_limit_policy(None).targets["local/big"]
    h = Harness(queues, queues.queue_key(target))
    await h.arrive_all("a", "b")
    assert h.granted == ["a"]
    queues.apply_policy(model_limit_policy(None))
    await settle()
    assert h.granted == ["a", "b"]  # the old limit no longer holds anyone back
    assert queues.queue_key(target) == "local"


@pytest.mark.parametrize(("carrier", "switch", "background"), [
    ("", "", "batch"),  # a dedicated backend sends the band by header
    ("priority: vllm", "", "batch"),
    ("priority: none", "", None),  # a backend that ignores the band
    ("", "batches: {background_slots: false}", None),
])
def test_batch_lines_hold_background_slots_where_the_backend_hears_the_band(
        carrier: str, switch: str, background: str | None) -> None:
    queues = BackendQueues.from_policy(loads(f"""
version: 1
{switch}
backends:
  local:
    type: openai
    url: http://127.0.0.1:9/v1
    deployment: dedicated
    max_concurrency: 4
    {carrier}
    models:
      demo: {{}}
      big: {{max_concurrency: 2}}
""", environ={}))
    assert queues.snapshot("local").background == background
    assert queues.snapshot("local/big").background == background
    assert "local/demo" not in queues.snapshots()  # no queue of its own
