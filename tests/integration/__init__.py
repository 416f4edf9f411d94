"""Integration tests: services against a real nats-server and redis-server started by fixtures
(topology, indexer, Redis index, connectors, security set-ups, Sentinel, the profiler).
"""
