"""The engines behind ``workers.engine.Engine``: ``mocker/`` (simulated, CPU, the default) and
``vllm/`` (vLLM's ``AsyncLLM``, GPU; the only code that imports vLLM).
"""
