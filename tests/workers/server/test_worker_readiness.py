"""``/ready`` and ``/health`` of a worker app whose engine thread dies."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from tests.support.aio import eventually, serving
from workers.build import build_worker
from workers.config import KVSettings, WorkerConfig
from workers.engine.selftest import run_self_test
from workers.server.app import create_app
from workers.server.state import ServerState


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_ready_and_health_answer_503_once_the_engine_thread_died():
    config = WorkerConfig(kv=KVSettings(cache_bytes=2 * 2**20))
    worker = build_worker(config, "w", b"secret")

    def die(engine) -> None:
        raise SystemExit("the engine thread stops here")

    async def main() -> None:
        state = ServerState(config.server, worker)
        worker.engine.start(asyncio.get_running_loop())
        try:
            await run_self_test(worker.engine, worker.identity.vocab_size, 16)
            state.ready.set()
            async with serving(create_app(state)) as url, aiohttp.ClientSession() as session:
                async def status(path: str) -> int:
                    async with session.get(f"{url}{path}") as response:
                        return response.status

                assert (await status("/ready"), await status("/health")) == (200, 200)
                asyncio.ensure_future(worker.engine.call(die))
                await eventually(lambda: worker.engine.failed)
                assert (await status("/ready"), await status("/health")) == (503, 503)
        finally:
            worker.engine.stop()

    asyncio.run(main())
