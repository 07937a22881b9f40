"""Canary rollout of a KV format: weighted pools of workers per model, sticky by
conversation, guarded by error rate, TTFT p99 and a greedy quality probe."""
