"""The top layer: the ``jetfleet`` command line (``cli/``) and what only it runs.

``up.py`` and ``embedded.py`` (the local fleet on embedded NATS and Redis), ``frontends.py``
(``frontend --processes N``), ``command.py`` (the argv of a ``jetfleet`` child process),
``tools.py`` (``infra init``, ``publish``, ``status``), ``replay_request.py`` and
``replay_traffic.py``, ``profile.py`` (the capacity profiler's load driver); ``deploy/`` holds the
NATS, Redis, Kubernetes, Prometheus and Grafana files and ``models/`` the shipped model card.
Imports every package below it; none imports it.
"""
