"""The router's and the worker's HTTP APIs as OpenAPI 3 documents.

The source of truth is YAML shipped in this package: ``router.yaml`` and
``worker.yaml`` (one document per server: their routes, security and health bodies
differ) and ``common.yaml`` (the OpenAI bodies, the error shape and the error
responses both serve, through one parser in ``radix.openai``). ``load_document``
returns one server's document standing alone: every ``common.yaml#/...`` reference
made local and ``common.yaml``'s components merged in. The two servers serve it as
``GET /openapi.json``; tests check it lists exactly the routes each app registers,
and the schema fuzzer (``bench.fuzz``) generates its requests from it. Reading this
package's files is the only I/O here.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

import yaml

SERVERS = ("router", "worker")
_COMMON = "common.yaml#"


def load_document(server: str) -> dict[str, Any]:
    """The OpenAPI document of ``server`` (``router`` or ``worker``), self-contained."""
    if server not in SERVERS:
        raise ValueError(f"server must be one of {', '.join(SERVERS)}, got {server!r}")
    document = _localized(_read(f"{server}.yaml"))
    components = document.setdefault("components", {})
    for kind, items in _read("common.yaml")["components"].items():
        clash = set(items) & set(components.get(kind, {}))
        if clash:
            raise ValueError(f"{server}.yaml redefines common components/{kind}: {sorted(clash)}")
        components.setdefault(kind, {}).update(items)
    return document


def _read(name: str) -> dict[str, Any]:
    text = resources.files(__name__).joinpath(name).read_text(encoding="utf-8")
    return yaml.safe_load(text)


def _localized(node: Any) -> Any:
    """``node`` with ``$ref: common.yaml#/x`` rewritten to ``#/x``."""
    if isinstance(node, dict):
        return {key: (("#" + value.removeprefix(_COMMON))
                      if key == "$ref" and isinstance(value, str) and value.startswith(_COMMON)
                      else _localized(value))
                for key, value in node.items()}
    if isinstance(node, list):
        return [_localized(item) for item in node]
    return node
