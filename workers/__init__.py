"""The worker: a process that runs one engine behind the fleet's subjects.

``main.py`` (the process), ``runtime.py`` (consumers <-> engine, chunks, acks, cancels, control),
``request_state.py`` (one request's outputs cut into ``TokenChunk``s), ``registry.py``
(registration, heartbeat, load reports), ``kv_batching.py``, ``recent_chunks.py``,
``metrics.py``, ``config.py``, ``engine.py`` (the interface every engine implements) and
``engines/``. Imports ``schemas``, ``base`` and ``model``; never ``router``.
"""
