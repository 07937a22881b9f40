"""Paged attention over the KV cache: torch reference, Triton kernels, device dispatch."""
