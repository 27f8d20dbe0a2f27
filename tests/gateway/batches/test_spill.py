"""Spill by deadline forecast: a batch the dedicated backend cannot finish in its window
sends lines to the route's shared targets (a batch-priced model first) and completes in
time; one it can finish stays on dedicated capacity."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import StartGateway, StartUpstream
from tests.fakes.openai_upstream import Behaviour
from tests.gateway.batches.conftest import batch_policy, chat_lines, jsonl, submit, until_final

BATCH_TARGETS = ["local/llama", "cloud/gpt-4o-mini", "cloud/gpt-4o-mini-batch"]


def spill_policy(local_url: str, cloud_url: str, data_dir: Path) -> dict[str, object]:
    policy = batch_policy(local_url, cloud_url, data_dir, spill_margin_s=2.0,
                          routes={"chat": {"spill_to": ["cloud/gpt-4o-mini-batch"]}})
    policy["routes"] = {"chat": {"targets": BATCH_TARGETS, "objective": "ordered"}}
    return policy


async def test_a_batch_too_big_for_the_local_backend_spills_and_still_completes_in_time(
        start_upstream: StartUpstream, start_gateway: StartGateway, tmp_path: Path) -> None:
    # 2 spare slots at 0.2 s a line: ~10 lines/s locally; 80 lines need ~8 s, the
    # window is 6 s less a 2 s margin
    local = await start_upstream(Behaviour(first_byte_delay_s=0.2), name="local")
    cloud = await start_upstream(Behaviour(first_byte_delay_s=0.05), name="cloud")
    gateway = await start_gateway(spill_policy(local.url, cloud.url, tmp_path))
    client = gateway.openai()

    batch = await until_final(client, (await submit(client, jsonl(chat_lines(80)),
                                                    window="6s")).id, within_s=9.0)

    assert batch.status == "completed" and batch.completed_at is not None
    assert batch.expires_at is not None and batch.completed_at <= batch.expires_at
    assert batch.request_counts is not None and batch.request_counts.completed == 80
    report = batch.model_extra["routegate"] if batch.model_extra else {}
    assert report["dedicated"]["lines"] == len(local.received) > 0
    assert report["shared"]["lines"] == len(cloud.received) > 0
    assert report["dedicated"]["lines"] + report["shared"]["lines"] == 80
    # spilled lines went to the batch-priced model, not the interactive one
    assert {r.json["model"] for r in cloud.received} == {"gpt-4o-mini-batch"}
    # a line's Idempotency-Key goes to the dedicated backend only: a shared API has none
    assert all("Idempotency-Key" in r.headers for r in local.received)
    assert not any("Idempotency-Key" in r.headers for r in cloud.received)
    assert report["cost_micros"] > 0 and report["all_shared_cost_micros"] > 0


async def test_a_batch_that_fits_its_window_never_leaves_dedicated_capacity(
        start_upstream: StartUpstream, start_gateway: StartGateway, tmp_path: Path) -> None:
    local = await start_upstream(Behaviour(first_byte_delay_s=0.05), name="local")
    cloud = await start_upstream(name="cloud")
    gateway = await start_gateway(spill_policy(local.url, cloud.url, tmp_path))
    client = gateway.openai()

    batch = await until_final(client, (await submit(client, jsonl(chat_lines(30)),
                                                    window="1h")).id)

    assert batch.status == "completed"
    assert len(local.received) == 30 and not cloud.received
