"""Where a request goes: the index of cached prefixes per worker, the load cost and
the policies that weigh one against the other."""
