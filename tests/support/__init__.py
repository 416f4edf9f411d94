"""What tests share, one copy each (test modules hold only their own cases).

- ``wait.py``: waiting on a condition instead of sleeping;
- ``clients.py``: the ``jetfleet`` CLI as a user runs it, SSE streams, the official clients;
- ``fleet.py``: worker, frontend, indexer and router processes against a test's NATS (``Fleet``);
- ``up.py``: ``jetfleet up`` started as a user starts it;
- ``nats_cluster.py``, ``nats_jwt.py``, ``redis_ha.py``, ``fake_k8s.py``: servers for special
  set-ups (a 3-node NATS cluster, operator-mode NATS auth, Redis with a replica and Sentinel, a
  fake Kubernetes API);
- ``kv_events.py``: KV events and batches, and real event streams from mocker schedulers;
- ``kv_contract.py``: the prefix-index contract suite, run against every implementation.
"""
