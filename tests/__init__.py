"""The test suite, by layer of reality: ``unit/`` (pure, no servers), ``integration/`` (real
nats-server and redis-server started by fixtures), ``e2e/`` (processes as a user runs them),
``chaos/`` (faults and soak), ``vllm_compat/`` (vLLM's own modules per release), ``bench/``
(benchmarks; not in the default run), ``mutation/`` (mutation-testing survivors). Shared:
``conftest.py`` (the servers) and ``support/`` (helpers, test servers and contract suites, one
copy each).
"""
