"""Attention kernel (:func:`attend`: SDPA / exact chunked / FlexAttention) and the SSMax normaliser."""
from .kernel import BACKENDS, CHUNK_THRESHOLD, DEFAULT_CHUNK, attend, flex_available, visible_keys
from .ssmax import SSMax

__all__ = ["attend", "visible_keys", "flex_available", "SSMax", "BACKENDS", "CHUNK_THRESHOLD", "DEFAULT_CHUNK"]
