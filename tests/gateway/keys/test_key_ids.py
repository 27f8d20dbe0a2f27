"""Managed key ids sort by creation, even for keys made in the same millisecond (the
admin listing pages by id)."""

from gateway.keys.record import new_key_id


def test_ids_made_back_to_back_sort_in_the_order_they_were_made() -> None:
    ids = [new_key_id() for _ in range(2_000)]  # many share a millisecond
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert all(i.startswith("key_") and len(i) == 4 + 12 + 8 for i in ids)
