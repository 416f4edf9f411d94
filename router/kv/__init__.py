"""KV-aware routing: event translation, the prefix index (in-memory and Redis), the kv policy."""
