"""Llama-family decoder: config, RoPE, weights loading, batched paged forward, sampling."""
