"""The one OpenAI layer: what ``/v1/completions`` and ``/v1/chat/completions`` accept
and how their answers look, written once for the router and the worker.

Pure code (no aiohttp, no asyncio, no torch): ``json_body`` decodes request bytes,
``fields`` reads typed values, ``sampling`` holds the shared bounds, ``requests``
parses and validates a whole request (fields, bounds, refused and unknown fields),
``prompt`` turns its prompt into token ids, ``responses`` shapes completions and
chat objects and stream chunks, and ``salt`` derives the per-tenant ``cache_salt``
sent to OpenAI-compatible backends. Every
refusal is a ``radix.api_errors.ApiError`` naming the field as the client sent it.
"""
