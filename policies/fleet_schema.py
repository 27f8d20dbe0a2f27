"""File models of a dedicated backend's fleet: its replicas and how one is picked.

    backends:
      local:
        launch: {model: demo, replicas: 2}      # N local_backend children, or
        urls: [http://10.0.0.5:8000/v1, ...]    # listed replicas, or
        url: http://vllm.ns.svc:8000/v1         # with `resolve: all`: every address of
        resolve: all                            #   the name (a headless service), re-resolved
        pick: prefix                            # prefix | least_busy | round_robin
        fleet: {prefix: {block_chars: 256, index_blocks: 65536}}
"""

from __future__ import annotations

from typing import Literal

from pydantic import SecretStr

from policies.file_model import FileModel, NonNegativeFloat, PositiveFloat, PositiveInt

Pick = Literal["prefix", "least_busy", "round_robin"]
PrefixCache = Literal["tenant", "shared"]


class PrefixPick(FileModel):
    """How `pick: prefix` scores a replica: what it likely holds of the prompt against
    how busy it is. score = cached_weight × (prompt share it holds)
    − queue_weight × (its queued + outstanding requests) − kv_weight × (its KV use 0..1);
    the highest score wins, ties to the least busy."""

    block_chars: PositiveInt = 256
    """Characters per hashed block of the prompt (the gateway does not know a replica's
    tokenizer); a block's hash names everything before it too."""
    index_blocks: PositiveInt = 65536
    """Block hashes the index remembers per backend (least recently used dropped first)."""
    precise: bool = False
    """The replicas are routegate `local_backend`s: each request names its blocks to
    the replica (`x-routegate-prefix-blocks`) and the gateway follows what each one
    stores and evicts (`/v1/prefix_events`, every `poll_interval_s`), so the index holds
    what the replicas hold instead of what they were sent. Off: the index is an
    estimate (any OpenAI-compatible server, vLLM included)."""
    cached_weight: NonNegativeFloat = 4.0
    """Weight of the share of the prompt (0..1) a replica likely holds."""
    queue_weight: NonNegativeFloat = 1.0
    """Weight of each request a replica has queued or running."""
    kv_weight: NonNegativeFloat = 1.0
    """Weight of a replica's KV-cache use (0..1): a full cache evicts what it holds."""


class FleetSettings(FileModel):
    """How the gateway watches a dedicated backend's replicas."""

    resolve_interval_s: PositiveFloat = 5.0
    """With `resolve: all`: how often the URL's host name is resolved again; replicas
    come and go without a reload."""
    poll_interval_s: PositiveFloat = 1.0
    """How often each replica's `/metrics` (queue, running, KV use) and `/health` are read."""
    prefix: PrefixPick = PrefixPick()
    """Scoring and index size for `pick: prefix`."""
    salt_key: SecretStr | None = None
    """Key of the per-tenant cache salt (a keyed hash of the tenant name sent as
    `cache_salt`); set it so salts cannot be recomputed from tenant names. The same on
    every gateway replica, or their salts differ."""
