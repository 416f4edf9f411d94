"""The test suite, by layer of reality: ``unit/`` (pure, no servers), ``integration/`` (real
nats-server and redis-server started by fixtures), ``e2e/`` (processes as a user runs them),
``chaos/`` (faults and soak), ``vllm_compat/`` (vLLM's own modules per release), ``bench/``
(benchmarks; not in the default run), ``mutation/`` (mutation-testing survivors). Shared here:
``conftest.py`` (the servers), ``kv_contract.py`` (the prefix-index contract suite), servers
for special set-ups (``nats_cluster.py``, ``nats_jwt.py``, ``redis_ha.py``, ``fake_k8s.py``),
``up.py`` (``jetfleet up`` as a user starts it), ``kv_events_gen.py`` and ``helpers.py``.
"""
