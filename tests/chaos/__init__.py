"""Chaos and soak: a NATS node lost, the NATS server stopped, Redis flushed, memory over time;
each prints its figures, a short variant in the default run and the long one under ``-m slow``.
"""
