"""The encoder-decoder Transformer: masks, attention backends, the KV cache for incremental
decoding, analytic FLOPs, and the model converted for decoding (packed, bf16, int8)."""
