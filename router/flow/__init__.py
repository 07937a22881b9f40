"""Flow control: requests wait in the router until a worker has headroom, and leave in
the order priority bands and weighted fair shares allow, preferring locality within
that bound (docs/flow-control.md)."""
