"""vLLM compatibility: vLLM's own pure-Python modules of each checked release, fetched from PyPI
(``sources.py``), driven against the worker's adapter (``-m 'not vllm_compat'`` offline).
"""
