"""Unit tests: the pure cores and codecs, no servers and no processes (``mocker_utils.py``: the
mocker's factory helpers).
"""
