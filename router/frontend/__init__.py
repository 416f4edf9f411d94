"""The HTTP frontend: the OpenAI-compatible API (and Anthropic Messages) on one ASGI app.

- the app and its process: ``http.py`` (routes, auth, the access log), ``service.py``, ``asgi.py``;
- one module per API family, parsing its requests and shaping its answers: ``chat.py``,
  ``completions.py``, ``embeddings.py``, ``anthropic.py``, the Responses API
  (``responses_api.py``, ``responses_items.py``, ``responses_shape.py``), protocol structs and
  errors (``openai_protocol.py``, ``errors.py``), generation parameters (``params.py``);
- serving a generation: ``serving.py`` (route, run, stream), ``stream.py`` and ``output.py``
  (the per-choice pipeline), ``shapes.py``, ``stops.py``, ``logprobs.py``, tools and their
  parsers (``tools.py``, ``tool_parsers.py``), ``reasoning.py``, ``prompts.py`` (chat templates),
  ``prompt_embeds.py``, tokenizing off the loop (``tokenize.py``), ``metrics.py``, ``observe.py``;
- work that outlives a connection, kept in JetStream: stored and background responses
  (``responses_store.py``, ``responses_background.py``, ``responses_endpoints.py``), the Batch
  API (``batch_lines.py``, ``batch_store.py``, ``batch_service.py``, ``batch_pace.py``), and the
  leases they run under (``leases.py``).
"""
