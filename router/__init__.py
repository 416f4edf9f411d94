"""Getting a request to a worker: the HTTP frontend, the routing library, the prefix index.

``frontend/`` (the OpenAI and Anthropic HTTP API), ``client.py``, ``generation.py`` and
``prefill_leg.py`` (route, publish, follow tokens, migrate, remote prefills), ``stack.py`` (the
wiring the frontend and the router service share), ``policies.py``, ``routers.py``,
``fleet_state.py``, ``discovery.py``, ``disagg.py`` (where a prefill runs), ``kv/`` (the prefix
index and the kv routers), ``indexer.py`` (the KV indexer service) and ``service.py`` (the router
service for NATS clients). Imports ``schemas``, ``base`` and ``model``; never ``workers``.
"""
