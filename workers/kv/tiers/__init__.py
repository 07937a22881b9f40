"""The KV tiers below the device: host memory, and disk below it.

Full blocks evicted from the device move down here and come back on an admission's
prefix hit. ``base.Tiers`` is all the prefix cache and the KV manager see of them
(``base.NoTiers`` for a worker without them); ``host_link.HostLink`` is the real one,
over ``host_tier`` (sealed with ``host_crypto``) and, below it, ``disk_tier`` (files
in ``disk_files``, written by ``disk_writer``). ``build`` assembles them;
``core_dumps`` keeps a worker that holds them from dumping its memory.
Nothing here imports the engine, the model or the server.
"""
