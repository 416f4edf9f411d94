"""Autoscaling: scaling decisions from the metric stream, and the connectors that apply them.

The pure planner (``core.py``, ``rules.py``, ``predictors.py``, ``capacity.py``, ``observe.py``,
``records.py``, ``config.py``; the profiler's pure half ``profile_fit.py``), its exact replay
(``replay.py``), its process (``service.py``) and ``connectors/``. Imports ``schemas``, ``base``,
``model``, ``router`` and ``workers``.
"""
