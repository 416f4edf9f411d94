"""The vLLM engine adapter (``--engine vllm``; GPU; ``pip install 'jetfleet[vllm]'``).

Map of the package:

- ``kv_events.py``    vLLM's KV event wire format -> ``schemas.kv_events``; sequence gaps
- ``subscriber.py``   ZMQ SUB + replay client of vLLM's KV event publisher
- ``cache_shadow.py`` vLLM's cached blocks as seen through its events (resync, consistency)
"""
