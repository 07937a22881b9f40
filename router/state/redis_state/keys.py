"""The Redis key schema of one deployment: every key lives under ``PREFIX:``.

docs/operations.md ("What Redis holds") describes each key; this is the one place
that spells them. Several deployments can share one Redis under different prefixes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Keys:
    """Key names under ``prefix`` (``RedisConfig.key_prefix``)."""

    prefix: str

    @property
    def routers(self) -> str:
        """ZSET router id -> lease expiry (ms, Redis clock): the live routers."""
        return f"{self.prefix}:routers"

    @property
    def slots_prefix(self) -> str:
        """Prefix of the per-router slot hashes (``slots``)."""
        return f"{self.prefix}:slots:"

    def slots(self, router_id: str) -> str:
        """HASH tenant -> concurrency slots that router holds (TTL: the lease)."""
        return f"{self.slots_prefix}{router_id}"

    @property
    def flow_served_prefix(self) -> str:
        """Prefix of the per-router flow totals hashes (``flow_served``)."""
        return f"{self.prefix}:flow:"

    def flow_served(self, router_id: str) -> str:
        """HASH fairness id -> weighted tokens that router's flow control dispatched
        over its recent window (TTL: the lease)."""
        return f"{self.flow_served_prefix}{router_id}"

    def token_window(self, tenant_id: str) -> str:
        """ZSET reservation id -> time recorded (ms): the tenant's token window."""
        return f"{self.prefix}:tokens:{tenant_id}"

    def token_amounts(self, tenant_id: str) -> str:
        """HASH reservation id -> tokens, plus ``_sum`` (TTL: the window)."""
        return f"{self.prefix}:tokens:{tenant_id}:n"

    @property
    def epoch(self) -> str:
        """STRING: a random id set by the first router after Redis starts empty; a
        router that sees it change knows the shared state was lost and resyncs."""
        return f"{self.prefix}:epoch"

    @property
    def workers(self) -> str:
        """HASH worker id -> worker config (JSON): the shared worker registry."""
        return f"{self.prefix}:workers"

    @property
    def workers_version(self) -> str:
        """STRING counter, incremented by every registry change."""
        return f"{self.prefix}:workers:version"

    @property
    def prefixes(self) -> str:
        """HASH ``model:digest`` -> token ids (uint32 bytes): shared public prefixes."""
        return f"{self.prefix}:prefixes"

    @property
    def canary(self) -> str:
        """HASH model -> its canary pools' weights and trips (JSON)."""
        return f"{self.prefix}:canary"

    @property
    def canary_version(self) -> str:
        """STRING counter, incremented by every canary change."""
        return f"{self.prefix}:canary:version"

    @property
    def routed(self) -> str:
        """STREAM of routing decisions for ``openai`` (approximate) workers."""
        return f"{self.prefix}:routed"

    def long_lived(self) -> list[str]:
        """Keys that outlive requests, refreshed by every heartbeat (``state_ttl_s``)."""
        return [self.epoch, self.workers, self.workers_version, self.prefixes, self.canary,
                self.canary_version, self.routed]
