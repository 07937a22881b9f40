"""A request's cache prediction checked against what its worker served.

The index predicts how many prompt tokens the chosen worker holds
(``Decision.matches``); the worker answers how many it served from its cache
(``usage.prompt_tokens_details.cached_tokens``). The *learn* step compares the two
for every answered request whose worker reported that number
(``router.dispatch.check_prediction``; a request whose worker reported none is not
checked, nor counted anywhere), as an engine reuses a cache: whole blocks of the
worker's block size, never the prompt's last token (``reusable_tokens``). A vLLM
worker's prediction is cut so already (``Decider.match``); ours is not, because the
block index also credits the partial blocks a worker announced and a speculative
entry is token-granular, while our worker reuses a partly matched block token by
token (copy on write), which the index cannot see. Cutting both numbers the same way
leaves only differences of whole blocks: ``EXACT`` (equal), ``OVER`` (predicted more
than served: the silent miss, the request went for a cache that was not there),
``UNDER`` (predicted less).
"""

from __future__ import annotations

EXACT, OVER, UNDER = "exact", "over", "under"
OUTCOMES = (EXACT, OVER, UNDER)


def reusable_tokens(num_tokens: int, num_prompt_tokens: int, block_size: int) -> int:
    """``num_tokens`` cached tokens of a ``num_prompt_tokens``-token prompt as an engine
    reuses them: cut to whole blocks of ``block_size``, and never the prompt's last
    token (the engine computes it to sample the first output)."""
    return max(min(num_tokens, num_prompt_tokens - 1), 0) // block_size * block_size


def prediction_outcome(num_predicted_tokens: int, num_served_tokens: int) -> str:
    """``EXACT``, ``OVER`` or ``UNDER`` for a prediction of ``num_predicted_tokens``
    against the ``num_served_tokens`` the worker served (both ``reusable_tokens``)."""
    if num_predicted_tokens == num_served_tokens:
        return EXACT
    return OVER if num_predicted_tokens > num_served_tokens else UNDER
