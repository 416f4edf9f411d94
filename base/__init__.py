"""The bottom layer under every service: NATS and Redis connections, stream topology, stream
reading, dead letters, the operations port, logging, signals, process groups, the worker watch.
Imports only ``schemas``."""
