"""Fused elementwise kernels for the Llama decoder: RMSNorm, residual add, RoPE, SwiGLU."""
