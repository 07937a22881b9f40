"""The front router: authenticates and tokenizes each OpenAI request, decides from its
radix index of every worker's cached prefixes and their load which worker serves it,
and forwards it there; follows the workers' KV events to keep the index exact."""
