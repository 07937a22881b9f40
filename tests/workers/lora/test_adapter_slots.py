"""``AdapterSlots`` under random request traffic against a brute-force model of its
rules: at most ``max_loras`` resident; a pinned adapter keeps its slot; a slot is
refused only when every slot is pinned; the victim is the least recently used
unpinned adapter, one with no request at all first; unloads wait for the last
request."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from workers.lora.adapters import AdapterSlots
from workers.lora.peft_files import AdapterError, AdapterSpec

NAMES = ("a", "b", "c", "d")
MAX_LORAS = 2


class RecordingLoader:
    """Remembers which adapter each slot holds (a real ``SlotLoader`` for a model with
    no weights)."""

    def __init__(self) -> None:
        self.slots: dict[int, str | None] = {}

    def load(self, slot: int, spec: AdapterSpec) -> None:
        self.slots[slot] = spec.name

    def clear(self, slot: int) -> None:
        self.slots[slot] = None


def spec(name: str) -> AdapterSpec:
    return AdapterSpec(name, f"/{name}", 4, 1.0, ("q_proj",), None, name * 8, 100)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(("begin", "admit", "end", "unload", "register")),
                          st.sampled_from(NAMES)), max_size=60))
def test_slots_follow_the_rules(ops):
    loader = RecordingLoader()
    slots = AdapterSlots(MAX_LORAS, loader, lambda s: s.name.encode())
    requests: list[tuple[str, int | None]] = []  # (adapter, pinned slot) per live request
    registered: set[str] = set()
    last_use: dict[str, int] = {}
    for tick, (op, name) in enumerate(ops):
        if op == "register" and name not in registered and name not in {r[0] for r in requests}:
            slots.register(spec(name))
            registered.add(name)
        elif op == "begin" and name in registered:
            slots.begin(name)
            requests.append((name, None))
        elif op == "admit":
            waiting = [i for i, (n, pin) in enumerate(requests) if n == name and pin is None]
            if waiting:
                _admit(slots, loader, requests, waiting[0], last_use, tick)
        elif op == "end":
            live = [i for i, (n, _) in enumerate(requests) if n == name]
            if live:
                adapter, pin = requests.pop(live[0])
                slots.end(adapter, pin is not None)
        elif op == "unload" and name in registered:
            slots.unregister(name)
            registered.discard(name)
        slots.check_invariants()
        resident = {a.name for a in slots.published if a.resident}
        assert len(resident) <= MAX_LORAS
        for adapter, pin in requests:
            if pin is not None:
                assert loader.slots[pin] == adapter  # pinned: never evicted nor moved
        assert {a.name for a in slots.published} == registered


def _admit(slots, loader, requests, index, last_use, tick) -> None:
    name = requests[index][0]
    before = dict(loader.slots)
    resident = {n for n in before.values() if n is not None}
    pinned = {n for n, pin in requests if pin is not None}
    slot = slots.acquire(name)
    if slot is None:
        assert name not in resident and len(resident) == MAX_LORAS and resident <= pinned
        return
    requests[index] = (name, slot)
    if name not in resident and len(resident) == MAX_LORAS:
        victim = before[slot]
        idle = [n for n in resident - pinned if n not in {r[0] for r in requests}]
        candidates = idle or sorted(resident - pinned)
        assert victim in candidates
        assert last_use.get(victim, -1) == min(last_use.get(n, -1) for n in candidates)
    last_use[name] = tick


def test_registrations_stop_at_max_registered():
    slots = AdapterSlots(MAX_LORAS, RecordingLoader(), lambda s: s.name.encode(),
                         max_registered=2)
    slots.register(spec("a"))
    slots.register(spec("b"))
    try:
        slots.register(spec("c"))
    except AdapterError as exc:
        assert exc.param == "lora_name" and "max_registered" in str(exc)
    else:
        raise AssertionError("a third adapter was registered")
    slots.unregister("a")
    slots.register(spec("c"))
