"""The process kinds of a deployment and how they are started: the registry, the `contentsvc run` supervisor,
and the local service the tests and benchmarks start."""
