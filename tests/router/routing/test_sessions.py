"""Sessions that return, the router's part: the headers read and refused, the table of
which worker served a session (tenants apart, deadlines, a bound), and stickiness that
yields at the bounded-load cap."""

from __future__ import annotations

import pytest

from radix.api_errors import ApiError
from router.config import SessionsConfig
from router.routing.sessions import SessionHint, SessionTable, prefer_session, read_session


def headers(**values: str):
    named = {k.replace("_", "-"): v for k, v in values.items()}
    return lambda name: named.get(name)


def test_a_session_is_named_by_either_header_and_its_hint_is_capped():
    assert read_session(headers(), 600) is None
    assert read_session(headers(x_session_retention_s="30"), 600) is None  # no session
    assert read_session(headers(x_session_id="s1"), 600) == SessionHint("s1", None)
    assert read_session(headers(x_dynamo_session_id="d1", x_session_retention_s="2.5"),
                        600) == SessionHint("d1", 2.5)
    assert read_session(headers(x_session_id="s1", x_session_retention_s="9000"),
                        600) == SessionHint("s1", 600)


@pytest.mark.parametrize("bad", [{"x_session_id": "s", "x_session_retention_s": v}
                                 for v in ("0", "-1", "nan", "inf", "soon")]
                         + [{"x_session_id": "x" * 257}, {"x_session_id": "a\nb"}])
def test_a_malformed_session_header_is_a_400_naming_it(bad):
    with pytest.raises(ApiError) as caught:
        read_session(headers(**bad), 600)
    assert caught.value.status == 400
    assert caught.value.param in ("x-session-id", "x-session-retention-s")


def test_the_table_keeps_a_tenants_session_until_its_deadline_within_its_bound():
    now = [0.0]
    table = SessionTable(SessionsConfig(ttl_s=10.0, max_entries=2), lambda: now[0])
    table.note("alice", "s1", "w1", 5.0)
    table.note("bob", "s1", "w2", None)  # the same id, another tenant: another session
    assert table.worker("alice", "s1") == "w1" and table.worker("bob", "s1") == "w2"
    now[0] = 6.0
    assert table.worker("alice", "s1") is None  # its hint ran out
    assert table.worker("bob", "s1") == "w2"  # the default 10 s
    table.note("alice", "s2", "w3", None)
    table.note("alice", "s3", "w3", None)  # past two entries: the oldest noted goes
    assert len(table) == 2 and table.worker("bob", "s1") is None


def test_the_sessions_worker_goes_first_until_the_bounded_load_cap():
    ranked = ["w2", "w1", "w3"]
    active = {"w1": 1, "w2": 0, "w3": 0}.__getitem__
    assert prefer_session(ranked, "w1", active, 2, 3, 1.5) == ["w1", "w2", "w3"]  # cap 2
    assert prefer_session(ranked, "w1", active, 1, 3, 1.5) == ranked  # cap 1: w1 at it
    assert prefer_session(ranked, None, active, 1, 3, 1.5) == ranked
    assert prefer_session(ranked, "w9", active, 1, 3, 1.5) == ranked  # not a candidate
    busy = {"w1": 4, "w2": 1, "w3": 1}.__getitem__
    assert prefer_session(ranked, "w1", busy, 6, 3, 1.5) == ranked  # cap ceil(1.5*7/3) = 4
