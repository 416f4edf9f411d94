"""The vLLM engine adapter (``--engine vllm``; ``bash infra/bootstrap.sh vllm``: the CUDA build with
a GPU, else vLLM's CPU build; docs/engines/vllm.md).

Map of the package (only ``backend.py`` imports vLLM, and only when constructed):

- ``engine.py``       ``VllmEngine``: the worker's ``Engine`` over vLLM's ``AsyncLLM``
- ``backend.py``      builds ``AsyncLLM``, ``SamplingParams``, prompts, LoRA requests
- ``config.py``       ``VllmEngineConfig`` -> ``AsyncEngineArgs`` keyword arguments
- ``mapping.py``      our sampling params -> vLLM's; vLLM finish reasons -> ours
- ``stats.py``        scheduler stats from a vLLM stat logger, for ``load()``
- ``lora.py``         adapter names <-> vLLM's integer LoRA ids
- ``kv_events.py``    vLLM's KV event wire format -> ``schemas.kv_events``; sequence gaps
- ``subscriber.py``   ZMQ SUB + replay client of vLLM's KV event publisher
- ``cache_shadow.py`` vLLM's cached blocks as seen through its events (resync, consistency)
- ``kv_follow.py``    the events on their way to the worker; resync; the cache reset after a loss
- ``versions.py``     what changed in which vLLM release (the engine asks, the tests check)
- ``platform.py``     what vLLM's CPU build needs (KV space, threads, cores), from the config
- ``cpu_list.py``     Linux CPU lists (``0-3,8``); ``pinning.py`` puts the worker on its cores
- ``lifeline.py``     a ``vllm.general_plugins`` entry point: vLLM's processes end with the worker
"""
