"""The mocker: a simulated vLLM-like engine on the CPU, for routing and planning at scale.

Pure cores: ``scheduler.py`` (continuous batching, chunked prefill, preemption, disaggregated
handoff), ``block_pool.py`` (prefix caching, LRU eviction, the host tier, an event outbox),
``sequence.py``, ``timing.py`` (simulated ms per step), ``logprobs.py`` and ``embedding.py``
(synthetic); ``engine.py`` drives the scheduler in simulated time; ``config.py`` its settings.
"""
