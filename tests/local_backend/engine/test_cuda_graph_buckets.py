"""Which captured decode graph a step of n sequences replays."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from local_backend.engine.cuda_graphs import DEFAULT_BUCKETS, bucket_for, decode_buckets


def test_buckets_end_with_the_engine_s_largest_batch() -> None:
    assert decode_buckets(32) == (1, 2, 4, 8, 16, 24, 32)
    assert decode_buckets(20) == (1, 2, 4, 8, 16, 20)
    assert decode_buckets(1) == (1,)
    assert decode_buckets(300)[-2:] == (256, 300)


def test_no_bucket_for_an_empty_step_or_one_past_the_largest() -> None:
    buckets = decode_buckets(16)
    assert bucket_for(0, buckets) is None
    assert bucket_for(17, buckets) is None
    assert bucket_for(16, buckets) == 16
    assert bucket_for(3, buckets) == 4


@settings(max_examples=200, deadline=None)
@given(max_num_seqs=st.integers(1, 512), rows=st.integers(1, 512))
def test_a_step_replays_the_smallest_bucket_that_holds_it(max_num_seqs: int, rows: int) -> None:
    buckets = decode_buckets(max_num_seqs, DEFAULT_BUCKETS)
    chosen = bucket_for(rows, buckets)
    if rows > max_num_seqs:
        assert chosen is None
        return
    assert chosen is not None and chosen >= rows
    assert all(b < rows for b in buckets if b < chosen)
