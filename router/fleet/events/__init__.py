"""Following what the workers cache: our workers' HTTP event stream (``follower``) and
vLLM's ZMQ events (``vllm``), both applied to the router's index and counted in the
same metrics (``metrics``)."""
