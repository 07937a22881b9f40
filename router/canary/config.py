"""The canary's config sections: a model's pools (``[models.M.pools.P]``) and their
guards (``[models.M.canary]``).

A model with pools sends each conversation to one pool, picked by weight
(``router.canary.pools``); the ``baseline`` pool is where a tripped pool's traffic
goes. The guards judge every other pool over the last ``window_s`` seconds (its
latest ``router.canary.guards.MAX_OUTCOMES`` requests at most) once it has
``min_requests`` requests there: a 5xx share above ``max_error_rate`` or a TTFT
p99 above ``max_ttft_p99_s`` (None turns a guard off) trips it, and so does a probe
(every ``probe_interval_s``: each of ``probe_prompts`` run greedily for
``probe_max_tokens`` tokens on one worker of each pool) in which more than
``probe_max_diverged`` prompts differ from the baseline's tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from radix.config_schema import NAME, FieldError, Section, setting

MAX_POOLS = 8
DEFAULT_PROBE_PROMPTS = (
    "The capital of France is",
    "Write a Python function that returns the sum of a list of integers.",
    "List three prime numbers greater than ten:",
    "Translate to German: The weather is nice today.",
)


@dataclass(frozen=True)
class PoolConfig(Section):
    """One pool of a model: its workers (ids of ``[[workers]]`` of that model) and its
    share of new conversations, relative to the other pools' weights."""

    workers: tuple[str, ...] = setting(pattern=NAME)
    weight: float = setting(low=0)

    def check(self) -> None:
        """At least one worker, none twice."""
        if not self.workers:
            raise FieldError("workers", "give at least one worker id")
        if len(set(self.workers)) != len(self.workers):
            raise FieldError("workers", "each worker at most once")


@dataclass(frozen=True)
class CanaryConfig(Section):
    """The guards of a model's pools and the pool they fall back to (see the module
    docstring)."""

    baseline: str = setting("baseline", pattern=NAME)
    window_s: float = setting(60.0, above=0)
    min_requests: int = setting(20, low=1)
    max_error_rate: float | None = setting(0.05, low=0, high=1)
    max_ttft_p99_s: float | None = setting(None, above=0)
    check_interval_s: float = setting(1.0, above=0)
    probe_interval_s: float = setting(60.0, above=0)
    probe_prompts: tuple[str, ...] = DEFAULT_PROBE_PROMPTS
    probe_max_tokens: int = setting(16, low=1, high=4096)
    probe_max_diverged: int = setting(0, low=0)
    probe_timeout_s: float = setting(30.0, above=0)

    def check(self) -> None:
        """Some probe prompts, and fewer allowed divergences than prompts."""
        if not self.probe_prompts:
            raise FieldError("probe_prompts", "give at least one prompt")
        if self.probe_max_diverged >= len(self.probe_prompts):
            raise FieldError("probe_max_diverged", "must be below the number of probe_prompts "
                                                   "(else the probe can never trip)")
