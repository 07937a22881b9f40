"""Quality regression harness: compares the answers of two worker KV configurations
(``python -m bench.quality``; see ``__main__``)."""
