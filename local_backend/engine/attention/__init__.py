"""Attention over the paged KV cache: the gather + SDPA reference (`paged.py`) and one
FlexAttention call per layer over the block tables (`flex.py`)."""
