"""KV-aware routing: event translation, the prefix index (in-memory and Redis), the kv policy.

``translate.py`` turns workers' ``KvEventBatch``es into index operations on the fleet's hashes;
``index.py`` is the index interface and its in-memory implementation, ``redis_index.py`` the
shared one (key layout ``keys.py``, scripts ``lua.py`` + ``scripts/``, lean connection
``resp.py``); ``shape.py`` tracks which workers' blocks are prefix-closed; ``routing.py`` holds
the cost rule and the types of the one-step route call; ``router.py`` the ``kv`` and ``approx``
routers; ``replay.py`` rebuilds the index at a past moment (``jetfleet replay kv``).
"""
