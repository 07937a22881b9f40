"""``radix-router up``: the cluster a config describes (``cluster``), the supervisor
that restarts what dies (``supervisor``), and the launcher that starts one child and
waits for its ``READY`` line (``launcher``)."""
