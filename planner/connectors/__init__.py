"""Scaling connectors: ``ScalingDecided`` in, a scaler acts, ``ScalingStatus`` out.

``base.py`` is the shell every connector shares (its durable consumer, skips, acks, status);
``local.py`` starts and stops worker processes on this machine; ``kubernetes.py`` sets the
replicas of Deployments through the Kubernetes API.
"""
