"""What tests share, one copy each (test modules hold only their own cases).

- ``wait.py``: waiting on a condition instead of sleeping (async, sync, a line in a log);
- ``clients.py``: the ``jetfleet`` CLI as a user runs it, the official OpenAI client, SSE streams;
- ``fleet.py``: worker, frontend, indexer and router processes against a test's NATS (``Fleet``,
  ``kv_fleet``);
- ``up.py``: ``jetfleet up`` started as a user starts it;
- ``nats_cluster.py``, ``nats_jwt.py``, ``redis_ha.py``, ``fake_k8s.py``: servers for special
  set-ups (a 3-node NATS cluster, operator-mode NATS auth, Redis with a replica and Sentinel, a
  fake Kubernetes API);
- ``builders.py``: worker registrations, fleet states, poison requests;
- ``kv_events.py``: KV events and batches, and real event streams from mocker schedulers;
- ``tokenizers.py``: the shipped model's tokenizer;
- ``engines.py``: an engine's output ``Sink``; ``vllm_fakes.py``: a fake vLLM for the adapter;
- ``kv_contract.py``, ``engine_contract.py``: contract suites, run unchanged against every prefix
  index and every engine.
"""
