"""The request's front: who is asking (auth, limits), what they ask (parsing and
bounds), and the prompt as token ids (tokenization, public prefixes)."""
