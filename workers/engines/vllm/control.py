"""The control ops a worker asks of its vLLM engine (``fleet.ctl.{worker}.*``): health
(``check_health``), sleep/wake (requests admitted while asleep wait for the wake; a failed sleep
leaves the worker serving; level 2 discards the weights, so the wake reloads them:
``wake_up(["weights"])``, ``collective_rpc("reload_weights")``, ``wake_up(["kv_cache"])``),
clear_kv (``reset_prefix_cache``), kv_resync, lora_load / lora_unload / lora_list
(``add_lora``/``remove_lora``/``list_loras``). Each answers a ``ControlResult``; an exception is a
failed op, never a dead worker."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import structlog

from workers.engine import ControlResult
from workers.engines.vllm.protocol import AsyncLlm

if TYPE_CHECKING:  # the engine builds its control with itself
    from workers.engines.vllm.engine import VllmEngine

log = structlog.get_logger("jetfleet.vllm")

ControlHandler = Callable[[dict[str, str]], Awaitable[ControlResult]]
CPU_CANNOT_SLEEP = (
    "vLLM's CPU build cannot sleep (sleep mode needs a GPU's CuMem allocator); the worker keeps "
    "serving with its weights and KV cache in place"
)


class VllmControl:
    def __init__(self, engine: VllmEngine) -> None:
        self.e = engine
        self._handlers: dict[str, ControlHandler] = {
            "health": self._health,
            "sleep": self._sleep,
            "wake": self._wake,
            "clear_kv": self._clear_kv,
            "kv_resync": self._kv_resync,
            "lora_load": self._lora_load,
            "lora_unload": self._lora_unload,
            "lora_list": self._lora_list,
        }

    @property
    def llm(self) -> AsyncLlm:
        if self.e.llm is None:
            raise RuntimeError("vLLM engine is not running")
        return self.e.llm

    async def run(self, op: str, args: dict[str, str]) -> ControlResult:
        handler = self._handlers.get(op)
        if handler is None:
            return ControlResult(False, f"unknown op {op!r}")
        if self.e.llm is None:
            return ControlResult(False, "vLLM engine is not running")
        try:
            return await handler(args)
        except Exception as exc:
            return ControlResult(False, f"{op} failed: {type(exc).__name__}: {exc}")

    async def _health(self, args: dict[str, str]) -> ControlResult:
        try:
            await self.llm.check_health()
        except Exception as exc:
            return ControlResult(False, f"vLLM unhealthy: {type(exc).__name__}: {exc}")
        data: dict[str, object] = {
            "sleeping": not self.e.awake.is_set(),
            "num_gpu_blocks": self.e.num_gpu_blocks,
            "cached_blocks": len(self.e.kv.shadow),
        }
        if self.e.features is not None and self.e.features.counts_unfinished:
            # requests vLLM itself has not finished (a cancel must bring it to 0)
            data["vllm_unfinished"] = self.llm.get_num_unfinished_requests()
        sub = self.e.kv.subscriber
        if sub is not None:
            st = sub.stats
            data["kv_events"] = {
                "batches": st.batches,
                "gaps_filled": st.gaps_filled,
                "losses": st.losses,
                "orphans": self.e.kv.shadow.orphans,
            }
            if not sub.running:
                return ControlResult(False, "KV event subscriber stopped", data)
        return ControlResult(True, "running", data)

    async def _sleep(self, args: dict[str, str]) -> ControlResult:
        if self.e.on_cpu:
            return ControlResult(False, CPU_CANNOT_SLEEP)
        if not self.e.config.enable_sleep_mode:
            return ControlResult(False, "vLLM sleep mode is off for this worker")
        level = int(args.get("level", "1"))
        if level not in (1, 2):
            return ControlResult(False, f"sleep level must be 1 or 2, not {level}")
        if self.e.running:
            return ControlResult(False, f"{len(self.e.running)} requests in flight; drain first")
        if not self.e.awake.is_set():
            return ControlResult(True, f"already sleeping (level {self.e.sleep_level})")
        self.e.awake.clear()
        try:
            if self.e.features is not None and not self.e.features.sleep_resets_cache:
                await self.llm.reset_prefix_cache()  # 0.10.0 would keep stale entries
            await self.llm.sleep(level)
        except Exception as exc:
            self.e.awake.set()
            log.warning("vllm_sleep_failed", level=level, error=repr(exc))
            return ControlResult(False, f"sleep failed, still serving: {type(exc).__name__}: {exc}")
        self.e.sleep_level = level
        self.e.kv.emptied()
        return ControlResult(True, f"sleeping (level {level}); new requests wait for wake")

    async def _wake(self, args: dict[str, str]) -> ControlResult:
        if self.e.awake.is_set():
            return ControlResult(True, "awake")
        if self.e.sleep_level == 2:  # the weights were discarded: load them again
            await self.llm.wake_up(tags=["weights"])
            await self.llm.collective_rpc("reload_weights")
            await self.llm.wake_up(tags=["kv_cache"])
        else:
            await self.llm.wake_up()
        level, self.e.sleep_level = self.e.sleep_level, 0
        self.e.awake.set()
        return ControlResult(True, "awake" + (" (weights reloaded)" if level == 2 else ""))

    async def _clear_kv(self, args: dict[str, str]) -> ControlResult:
        result = await self.e.kv.reset()
        if result is False:
            return ControlResult(False, "blocks in use; drain first")
        if result is None:
            return ControlResult(
                True,
                f"reset requested; vLLM {self.e.features.label if self.e.features else ''} does "
                "not report whether it reset (before 0.12): the fleet forgets this worker's "
                "blocks when vLLM publishes AllBlocksCleared",
                {"confirmed": False},
            )
        return ControlResult(True, "prefix cache reset", {"confirmed": True})

    async def _kv_resync(self, args: dict[str, str]) -> ControlResult:
        if self.e.kv.subscriber is None or self.e.hooks is None:
            return ControlResult(False, "KV events are off for this worker")
        return ControlResult(True, f"cache republished ({await self.e.kv.resync()} blocks)")

    async def _lora_load(self, args: dict[str, str]) -> ControlResult:
        name, path = args.get("name", ""), args.get("path", "")
        if not name or not path:
            return ControlResult(False, "lora_load needs args name and path")
        if not self.e.config.enable_lora:
            return ControlResult(False, "LoRA is off for this worker")
        if self.e.loras.get(name) is not None:
            return ControlResult(True, f"adapter {name!r} already loaded")
        lora = self.e.loras.add(name, path)
        try:
            ok = await self.llm.add_lora(self.e.backend.lora_request(name, lora.lora_id, path))
        except Exception:
            self.e.loras.remove(name)
            raise
        if not ok:
            self.e.loras.remove(name)
            return ControlResult(False, f"vLLM did not load adapter {name!r}")
        return ControlResult(True, f"adapter {name!r} loaded", {"lora_id": lora.lora_id})

    async def _lora_unload(self, args: dict[str, str]) -> ControlResult:
        name = args.get("name", "")
        lora = self.e.loras.get(name)
        if lora is None:
            return ControlResult(False, f"adapter {name!r} is not loaded")
        ok = await self.llm.remove_lora(lora.lora_id)
        self.e.loras.remove(name)
        detail = f"adapter {name!r} unloaded" if ok else f"adapter {name!r} was not in vLLM"
        return ControlResult(True, detail)

    async def _lora_list(self, args: dict[str, str]) -> ControlResult:
        in_vllm = set(await self.llm.list_loras())
        names = [lora.name for lora in self.e.loras.loaded() if lora.lora_id in in_vllm]
        return ControlResult(True, data={"loras": names})
