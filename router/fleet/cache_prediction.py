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
leaves only differences of whole blocks.

Part of a prediction may be vouched for only by requests still in flight: a prefix
just routed to the worker that it has not confirmed (``Matches.routed``: no
``stored`` event yet; ``Matches.unconfirmed``: an approximate worker's entry whose
request has had no first token yet). Neither our worker nor vLLM waits for another
request's prefill, so a request sent for such a prefix may compute it again. The
outcome therefore weighs what was served against the *confirmed* part as well:
``EXACT`` (predicted = served), ``UNDER`` (predicted less), ``OVER`` (served less
than the confirmed part: the silent miss, the index held a cache that was not
there) and ``IN_FLIGHT`` (served less than predicted, but at least the confirmed
part: the shortfall is in-flight credit, the index was early, not wrong).
"""

from __future__ import annotations

EXACT, OVER, UNDER, IN_FLIGHT = "exact", "over", "under", "in_flight"
OUTCOMES = (EXACT, OVER, UNDER, IN_FLIGHT)


def reusable_tokens(num_tokens: int, num_prompt_tokens: int, block_size: int) -> int:
    """``num_tokens`` cached tokens of a ``num_prompt_tokens``-token prompt as an engine
    reuses them: cut to whole blocks of ``block_size``, and never the prompt's last
    token (the engine computes it to sample the first output)."""
    return max(min(num_tokens, num_prompt_tokens - 1), 0) // block_size * block_size


def prediction_outcome(num_predicted_tokens: int, num_confirmed_tokens: int,
                       num_served_tokens: int) -> str:
    """``EXACT``, ``UNDER``, ``OVER`` or ``IN_FLIGHT`` for a prediction of
    ``num_predicted_tokens``, ``num_confirmed_tokens`` of them confirmed (at most the
    prediction), against the ``num_served_tokens`` the worker served (all three
    ``reusable_tokens``): ``OVER`` only when the worker served less than the
    confirmed part."""
    if num_predicted_tokens == num_served_tokens:
        return EXACT
    if num_predicted_tokens < num_served_tokens:
        return UNDER
    return OVER if num_served_tokens < num_confirmed_tokens else IN_FLIGHT
