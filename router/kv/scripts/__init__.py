"""The Lua scripts of the Redis prefix index (``*.lua``), read by ``router/kv/lua.py``.

``common.lua`` is prepended to each of ``apply_many``, ``drop_worker``, ``match``, ``route`` and
``release``. ``route.lua`` mirrors the cost rule of ``router/kv/routing.py`` (one contract suite
checks both).
"""
