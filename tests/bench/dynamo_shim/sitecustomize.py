"""Loaded by Dynamo's processes in the benchmark (``PYTHONPATH``), never by jetfleet's.

1. ``dynamo/vllm/multimodal_utils/models/qwen.py`` imports
   ``transformers.models.qwen2_vl.image_processing_qwen2_vl``, which in transformers 5 imports
   torchvision at its top; the registry's torchvision for torch 2.13 is a CUDA build that does not
   load beside torch+cpu. The function Dynamo takes from it (``smart_resize``, Qwen-VL image
   routing, unused for text) is also in the PIL variant of the module: the import is pointed
   there.
2. vLLM 0.32 removed ``vllm.v1.engine.utils.get_engine_zmq_addresses``, which Dynamo 1.6.1
   imports (for its multi-process embedding path only): a stub that raises is added.
"""

import importlib.abc
import importlib.machinery
import importlib.util
import sys

_QWEN = "transformers.models.qwen2_vl.image_processing_qwen2_vl"
_QWEN_PIL = "transformers.models.qwen2_vl.image_processing_pil_qwen2_vl"
_ENGINE_UTILS = "vllm.v1.engine.utils"


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):  # type: ignore[no-untyped-def]
        if name == _QWEN and importlib.util.find_spec("torchvision") is None:
            return importlib.machinery.ModuleSpec(name, self)
        if name == _ENGINE_UTILS:
            sys.meta_path.remove(self)
            try:
                spec = importlib.util.find_spec(name)
            finally:
                sys.meta_path.insert(0, self)
            if spec is None or spec.loader is None:
                return None
            original = spec.loader.exec_module

            def exec_module(module):  # type: ignore[no-untyped-def]
                original(module)
                if not hasattr(module, "get_engine_zmq_addresses"):

                    def get_engine_zmq_addresses(*_a, **_k):  # type: ignore[no-untyped-def]
                        raise NotImplementedError("removed in vLLM 0.32")

                    module.get_engine_zmq_addresses = get_engine_zmq_addresses

            spec.loader.exec_module = exec_module  # type: ignore[method-assign]
            return spec
        return None

    def create_module(self, spec):  # type: ignore[no-untyped-def]
        return importlib.import_module(_QWEN_PIL)

    def exec_module(self, module):  # type: ignore[no-untyped-def]
        return None


sys.meta_path.insert(0, _Alias())
