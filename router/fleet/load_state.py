"""How the router knows one worker's load (docs/router.md, "How load is known").

*Polled*: each probe's ``/info`` or ``/metrics`` (vLLM, SGLang and OpenAI-compatible
workers, our workers that send no load frames, and all of them with
``registry.pushed_load`` off), every ``registry.poll_interval_s``.

*Pushed*: our worker sends a load frame on its KV event stream whenever its load
changes (``radix.events.LoadReport``). The router's view is the latest frame plus
what it sent the worker since that frame arrived, which the frame cannot include:
each such request counts as waiting there, its prompt tokens as waiting tokens
(``WorkerState.view`` then takes this router's in-flight prompts out of the waiting
tokens: they are counted in flight).

*Unknown*: a worker whose stream negotiated load frames but is now silent past
``kv_events.read_timeout_s``, ended, or reconnecting, until the next frame. Unknown
is never idle: the worker is seen with a full batch (its ``max_num_running``, or at
least its last reported running count and this router's in-flight count), a full KV
cache, and the last frame's queue plus everything sent since. It stays routable (not
saturated unless that queue is), so it is chosen only when every other worker costs
as much.

While a worker pushes (or its stream went quiet), the registry probes it only every
``registry.probe_interval_s``, for identity and liveness, and at once when
``probe_wanted`` is set: its stream opened or ended, or a frame's ``ready_seq``
moved (its ``/ready`` changed: readiness, draining, adapters) or said nothing yet.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from radix.events import LoadReport
from router.fleet.probes import WorkerLoad

POLLED, PUSHED, UNKNOWN = "polled", "pushed", "unknown"


class LoadState:
    """One worker's load and how the router knows it: ``source`` is ``POLLED``,
    ``PUSHED`` or ``UNKNOWN`` (module docstring); ``load`` the last one reported (a
    probe's or a frame's); ``pushes`` whether its KV event stream (open now or last)
    sends load frames; ``seq`` the last frame's sequence number on this stream;
    ``updated_at`` (monotonic) when the load last came in, a frame or a probe (None:
    never). ``num_requests_since`` and ``num_tokens_since`` count what this router
    sent the worker since then. Changed by the registry (``polled``), the KV event
    follower (``stream_opened``, ``pushed``, ``lost``, ``stopped``) and decisions
    (``sent``)."""

    __slots__ = ("source", "load", "pushes", "seq", "ready_seq", "updated_at",
                 "num_requests_since", "num_tokens_since", "probe_wanted", "_clock")

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.source = POLLED
        self.load = WorkerLoad()
        self.pushes = False
        self.seq: int | None = None
        self.ready_seq: int | None = None
        self.updated_at: float | None = None
        self.num_requests_since = 0
        self.num_tokens_since = 0
        self.probe_wanted = asyncio.Event()
        self._clock = clock

    def polled(self, load: WorkerLoad) -> None:
        """A probe's load: taken unless the worker pushes its load."""
        if not self.pushes:
            self._update(load)

    def stream_opened(self, pushes: bool) -> None:
        """A KV event stream (re)connected, sending load frames or not: probe at once
        (the worker may have restarted); a pushing worker's load is unknown until its
        first frame, another's is polled again."""
        self.pushes, self.seq, self.ready_seq = pushes, None, None
        self.source = UNKNOWN if pushes else POLLED
        self.probe_wanted.set()

    def pushed(self, report: LoadReport) -> None:
        """A load frame arrived (one older than the last on this stream is dropped)."""
        if self.seq is not None and report.seq < self.seq:
            return
        if report.ready_seq != self.ready_seq:
            self.probe_wanted.set()
        self.seq, self.ready_seq, self.source = report.seq, report.ready_seq, PUSHED
        self.pushes = True
        self._update(WorkerLoad(
            num_requests_running=report.num_requests_running,
            num_requests_waiting=report.num_requests_waiting,
            num_waiting_tokens=report.num_waiting_tokens,
            kv_cache_usage_ratio=report.kv_cache_usage_ratio,
            max_num_requests=report.max_num_requests,
            max_num_running=report.max_num_running,
            num_held_blocks=report.num_held_blocks,
            max_held_blocks=report.max_held_blocks))

    def lost(self) -> None:
        """The stream ended or went silent past its deadline: a pushing worker's load is
        unknown until a frame comes again; probe at once (is it alive?)."""
        if self.pushes:
            self.source = UNKNOWN
            self.probe_wanted.set()

    def stopped(self) -> None:
        """Its stream is no longer followed (it left routing): polled from now on."""
        self.pushes, self.source = False, POLLED

    def sent(self, num_prompt_tokens: int) -> None:
        """This router just sent the worker a request whose prompt has
        ``num_prompt_tokens``."""
        self.num_requests_since += 1
        self.num_tokens_since += num_prompt_tokens

    def measures(self, num_in_flight_requests: int) -> tuple[int, int, int, float]:
        """Running requests, waiting requests, waiting tokens and KV usage as routing
        sees them now (module docstring), given this router's in-flight count there."""
        load = self.load
        running, waiting = load.num_requests_running, load.num_requests_waiting
        tokens, usage = load.num_waiting_tokens, load.kv_cache_usage_ratio
        if self.source is POLLED:
            return running, waiting, tokens, usage
        waiting += self.num_requests_since
        tokens += self.num_tokens_since
        if self.source is PUSHED:
            return running, waiting, tokens, usage
        return (max(load.max_num_running or 0, running, num_in_flight_requests), waiting,
                tokens, 1.0)

    def age_s(self) -> float | None:
        """Seconds since the load last came in (None: never)."""
        return None if self.updated_at is None else self._clock() - self.updated_at

    def _update(self, load: WorkerLoad) -> None:
        self.load, self.updated_at = load, self._clock()
        self.num_requests_since = self.num_tokens_since = 0
