"""The HTTP frontend: the OpenAI-compatible API (and Anthropic Messages) on one ASGI app.

``app.py`` (the app), ``service.py`` (the process), ``asgi.py``; request parsing and errors
(``openai_protocol.py``), responses and SSE (``responses.py``), the Responses and Messages
translations (``responses_api.py``, ``anthropic.py``), tokenizing off the loop (``tokenize.py``),
tools, tool-call and reasoning parsers, the per-choice output pipeline (``output.py``), stop
strings, logprobs, embeddings, ``prompt_embeds``, and the frontend's metrics.
"""
