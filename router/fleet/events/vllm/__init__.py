"""vLLM workers: their KV event wire format (``wire``), its translation into the
router index's events (``translate``), the ZMQ follower (``follower``), the token
parity probe (``parity``) and how a registered worker is attached (``attach``)."""
