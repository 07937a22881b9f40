"""Workers found by watching Kubernetes: pods by label, or through an InferencePool
(``watcher``), followed level-triggered (``list_watch``), judged pod by pod
(``pods``) and kept equal to the registry's discovered workers (``reconcile``).
docs/kubernetes.md has the whole story."""
