"""Prefill/decode disaggregation between our workers: a producer holds a prefilled
prompt's blocks and serves them on its transfer port (``producer``); a consumer pulls
the ones its cache lacks and imports them before it decodes (``consumer``); both speak
``wire``'s frames. docs/pd.md has the protocol."""
