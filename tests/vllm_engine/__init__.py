"""The real vLLM engine (its CPU build in CI) serving real models through the whole fleet."""
