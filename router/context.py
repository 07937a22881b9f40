"""``Router``: everything one router app owns, built once per app (no globals).

Handlers reach it as ``request.app[ROUTER]``. It is built inside the running event
loop (the shared ``aiohttp.ClientSession`` and the poll tasks need one) and closed
by the app's cleanup.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import aiohttp
from aiohttp import web

from radix.openai.salt import CacheSalts
from router.canary.controller import Canary
from router.config import FlowConfig, RouterConfig
from router.decision import Decider
from router.fleet.events.follower import KVEventFollower
from router.fleet.events.vllm.attach import VllmAttacher
from router.fleet.index_modes import key_mode_problem, route_approximately, route_exactly
from router.fleet.registry import WorkerRegistry, WorkerState
from router.flow.controller import FlowController, NoFlowControl
from router.flow.headroom import RequestLimit, no_request_limit, request_limit
from router.flow.shares import FlowShares
from router.forward.pool import UpstreamPool
from router.forward.proxy import Proxy
from router.front.auth import Authenticator
from router.front.limits import TenantLimiter
from router.metrics import RouterMetrics
from router.models import Models
from router.routing.index import NamespaceDigest, RouterIndex
from router.routing.policy import Policy, make_policy
from router.routing.sessions import SessionTable
from router.siblings.protocol import NoSiblings, Siblings
from router.siblings.redis_siblings import RedisSiblings
from router.sources.service import KVSources
from router.state.redis_state.flow_shares import RedisFlowShares
from router.state.redis_state.limits import RedisSharedState
from router.state.redis_state.link import RedisLink
from router.state.shared_state import InProcessSharedState, SharedState
from router.worker_kinds import EventSource

if TYPE_CHECKING:  # the Kubernetes client is imported only by a router that discovers
    from router.fleet.discovery.watcher import KubernetesDiscovery


@dataclass
class Router:
    """The parts of one router, wired together. Only ``registry`` changes its
    membership at run time; the other references are fixed for the app's life."""

    config: RouterConfig
    models: Models
    auth: Authenticator
    limiter: TenantLimiter
    index: RouterIndex
    policy: Policy
    session: aiohttp.ClientSession
    registry: WorkerRegistry
    proxy: Proxy
    pool: UpstreamPool
    metrics: RouterMetrics
    cache_salts: CacheSalts
    siblings: Siblings
    vllm: VllmAttacher
    canary: Canary
    decider: Decider
    flow: FlowController | NoFlowControl
    discovery: KubernetesDiscovery | None

    @classmethod
    def build(cls, config: RouterConfig, secret: bytes, state: SharedState,
              siblings: Siblings | None = None, flow_shares: FlowShares | None = None
              ) -> Router:
        """Load tokenizers, resolve the policy and wire the parts; ValueError naming
        the config field when something is unusable. Call inside the event loop.
        ``state`` holds the tenant counters, ``siblings`` (default ``NoSiblings``) the
        registry shared with other routers; the app's startup starts it.
        ``flow_shares``: what the other routers served per fairness id (None: this
        router's flow control is fair over its own traffic only)."""
        models = Models.from_config(config.models)
        policy = make_policy(config.policy.name, config.policy.weights)
        index = RouterIndex(config.index)
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60),
            auto_decompress=False)

        metrics = RouterMetrics(models.token_cache_stats, index.stats)
        auth = Authenticator(config.auth)
        salts = CacheSalts(secret)
        vllm = VllmAttacher(index, session, secret, salts, auth.tenant_ids(), metrics.kv_events,
                            config.registry.probe_timeout_s, config.kv_events)

        async def follow(worker: WorkerState) -> None:
            if worker.capabilities.events is EventSource.ZMQ_WHEN_CONFIGURED:
                await vllm.follow(worker, models.get(worker.model))
                return
            if (problem := key_mode_problem(worker)) is not None:
                route_approximately(worker, index, problem)
                return
            route_exactly(worker, index)
            base = NamespaceDigest(worker.namespace or "")
            await KVEventFollower(
                index, worker, session, metrics.kv_events,
                lambda namespace: worker.lora.event_namespace(namespace, base,
                                                              worker.worker_namespace),
                config.kv_events, config.registry.pushed_load).run()

        registry = WorkerRegistry(config.registry, models, secret, session, index, follow)
        metrics.kv_events.follow_workers(registry.workers)
        metrics.registry.register(registry.namespaces)
        siblings = siblings or NoSiblings()
        metrics.follow_siblings(siblings)
        pool = UpstreamPool(config.proxy.connect_timeout_s, config.proxy.request_timeout_s)
        canary = Canary(config.models, secret, lambda model, text: models.get(model).tokenizer
                        .encode(text, add_special_tokens=False), metrics.registry)
        discovery = None
        if config.discovery.enabled:
            from router.fleet.discovery.watcher import KubernetesDiscovery

            discovery = KubernetesDiscovery(config, registry, models, session)
            metrics.follow_discovery(discovery.status)
        proxy = Proxy(pool, config.proxy)
        limit = request_limit(config.flow) if config.flow.enabled else no_request_limit
        sources = (KVSources(index, config.kv_sources, pool, metrics.registry)
                   if config.kv_sources.enabled else None)
        sessions = SessionTable(config.sessions) if config.sessions.enabled else None
        decider = Decider(index, policy, registry, canary, siblings, proxy, config.pd,
                          config.proxy.max_attempts, metrics, limit, sources, sessions)
        return cls(config, models, auth, TenantLimiter(state), index, policy, session, registry,
                   proxy, pool, metrics, salts, siblings, vllm, canary, decider,
                   _flow_control(config.flow, decider, limit, metrics, flow_shares), discovery)

    async def close(self) -> None:
        """Stop discovering and dispatching queued requests, leave the siblings, stop the
        canary's guards, stop polling
        and following every worker, then close the request path's idle connections and
        the client session."""
        if self.discovery is not None:
            await self.discovery.close()
        await self.flow.close()
        await self.siblings.close()
        await self.canary.close()
        await self.registry.close()
        self.vllm.close()
        self.pool.close()
        await self.session.close()


def _flow_control(config: FlowConfig, decider: Decider, limit: RequestLimit,
                  metrics: RouterMetrics, shares: FlowShares | None
                  ) -> FlowController | NoFlowControl:
    """The queue step: a ``FlowController`` with its metrics when ``config.enabled``."""
    if not config.enabled:
        return NoFlowControl()
    return FlowController(config, decider, limit, metrics.registry, shares)


def shared_backends(config: RouterConfig
                    ) -> tuple[SharedState, Siblings, FlowShares | None]:
    """(limits, siblings, flow shares) for ``config``: in process (no flow shares) when
    ``redis.url`` is None, else on Redis, sharing one ``RedisLink``. Build inside the
    event loop; ``siblings.start`` connects."""
    if config.redis.url is None:
        return InProcessSharedState(), NoSiblings(), None
    link = RedisLink(config.redis)
    return (RedisSharedState(link),
            RedisSiblings(link, config.admin.worker_key_env_prefix, config.workers),
            RedisFlowShares(link, config.flow.share_sync_interval_s))


ROUTER = web.AppKey("router", Router)
