"""LoRA adapters loaded into one vLLM engine: our names <-> vLLM's integer ids. Pure.

vLLM names an adapter in a request by ``LoRARequest(lora_name, lora_int_id, lora_path)`` and in
its KV events (before ``lora_name`` was added to them) by ``lora_int_id`` alone; ids here start
at 1 (vLLM reserves 0 for "no adapter") and are never reused while the engine lives.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LoadedLora:
    name: str
    lora_id: int
    path: str


class LoraRegistry:
    def __init__(self) -> None:
        self._by_name: dict[str, LoadedLora] = {}
        self._names: dict[int, str] = {}
        self._next_id = 1

    @property
    def names_by_id(self) -> Mapping[int, str]:
        """Live view for the KV event decoder (ids of adapters currently loaded)."""
        return self._names

    def get(self, name: str) -> LoadedLora | None:
        return self._by_name.get(name)

    def add(self, name: str, path: str) -> LoadedLora:
        lora = LoadedLora(name, self._next_id, path)
        self._next_id += 1
        self._by_name[name] = lora
        self._names[lora.lora_id] = name
        return lora

    def remove(self, name: str) -> LoadedLora | None:
        lora = self._by_name.pop(name, None)
        if lora is not None:
            self._names.pop(lora.lora_id, None)
        return lora

    def loaded(self) -> list[LoadedLora]:
        return sorted(self._by_name.values(), key=lambda lora: lora.name)
