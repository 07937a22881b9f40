"""A worker's binary KV event stream read on a daemon thread, frame by frame, with the
time each frame arrived: what a router reads, asking for load frames or not (an older
router does not). Plain module, no pytest."""

from __future__ import annotations

import http.client
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from typing import NamedTuple

from radix.events import (
    FRAME_HEADER,
    LOAD_FRAMES_HEADER,
    LOAD_QUERY,
    MSGPACK_CONTENT_TYPE,
    KVEvent,
    LoadReport,
    decode_frame,
)
from tests.support.polling import wait_until


class Frame(NamedTuple):
    """One frame: when it arrived (``time.monotonic``), its body, and what it decodes to."""

    arrived_at: float
    body: bytes
    decoded: list[KVEvent] | LoadReport


class FrameStream:
    """``GET {url}/kv/events`` in the binary form, with ``load=1`` when ``ask_load``;
    ``load_frames_header`` is what the worker answered in ``X-Load-Frames``."""

    def __init__(self, url: str, ask_load: bool, headers: Mapping[str, str] | None = None
                 ) -> None:
        parsed = urllib.parse.urlparse(url)
        query = urllib.parse.urlencode([LOAD_QUERY] if ask_load else [])
        self._conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=30)
        self._conn.request("GET", f"/kv/events?{query}",
                           headers={**(headers or {}), "Accept": MSGPACK_CONTENT_TYPE})
        self._response = self._conn.getresponse()
        assert self._response.status == 200
        self.load_frames_header = self._response.getheader(LOAD_FRAMES_HEADER)
        self.frames: list[Frame] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            while len(head := self._response.read(FRAME_HEADER.size)) == FRAME_HEADER.size:
                body = self._response.read(FRAME_HEADER.unpack(head)[0])
                frame = Frame(time.monotonic(), body, decode_frame(body))
                with self._lock:
                    self.frames.append(frame)
        except (OSError, ValueError, AttributeError, http.client.HTTPException):
            return  # closed under a blocked read (http.client then raises AttributeError)

    def loads(self) -> list[tuple[float, LoadReport]]:
        """The load frames so far, with their arrival times."""
        with self._lock:
            return [(f.arrived_at, f.decoded) for f in self.frames
                    if isinstance(f.decoded, LoadReport)]

    def wait_for_load(self, predicate: Callable[[LoadReport], bool], timeout_s: float = 10.0
                      ) -> tuple[float, LoadReport]:
        """The first load frame (and its arrival) for which ``predicate`` holds, waiting
        for it."""
        return wait_until(lambda: next(((at, r) for at, r in self.loads() if predicate(r)), None),
                          timeout_s, "a load frame", interval_s=0.005)

    def close(self) -> None:
        """Drop the connection."""
        self._conn.close()
