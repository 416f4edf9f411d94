"""``prompt_embeds`` (completions, as vLLM takes them): read the tensor's shape without torch. Pure.

vLLM's server takes a base64 ``torch.save`` of a 2-D tensor (positions x hidden size). The
frontend needs only the shape (the context check, usage, routing), so it reads the archive's
``data.pkl`` with an unpickler that knows exactly the names a saved tensor uses and refuses every
other (nothing is executed: the same allow-list idea as torch's own ``weights_only`` loader). The
bytes travel to the worker as they came; only the vLLM worker loads the tensor, with torch.
"""

from __future__ import annotations

import base64
import binascii
import io
import pickle
import zipfile
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

_DTYPES = {
    "FloatStorage": "float32",
    "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16",
    "DoubleStorage": "float64",
}


class PromptEmbedsError(ValueError):
    """Not a tensor saved by ``torch.save``, or not one a prompt can be."""


@dataclass(frozen=True)
class TensorHeader:
    dtype: str
    shape: tuple[int, ...]


class _Storage:
    def __init__(self, name: str) -> None:
        self.name = name


def _rebuild(storage: Any, offset: int, size: Any, stride: Any, *rest: Any) -> TensorHeader:
    kind = storage[1].name if isinstance(storage, tuple) and len(storage) > 1 else ""
    dtype = _DTYPES.get(kind)
    if dtype is None:
        raise PromptEmbedsError(f"prompt_embeds of storage {kind or '?'} are not supported")
    return TensorHeader(dtype, tuple(int(n) for n in size))


class _HeaderUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild
        if module == "torch" and name in _DTYPES:
            return _Storage(name)
        if (module, name) == ("collections", "OrderedDict"):
            return OrderedDict
        raise PromptEmbedsError(f"prompt_embeds holds {module}.{name}, not a tensor")

    def persistent_load(self, pid: Any) -> Any:
        return pid  # ("storage", storage class, key, location, numel)


def decode_prompt_embeds(text: str) -> tuple[bytes, TensorHeader]:
    """The raw bytes of a base64 ``torch.save`` and the tensor's header; ``PromptEmbedsError``
    when it is not a saved tensor."""
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise PromptEmbedsError("prompt_embeds is not valid base64") from None
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            names = [n for n in archive.namelist() if n.endswith("/data.pkl")]
            if len(names) != 1:
                raise PromptEmbedsError("prompt_embeds is not a torch.save archive")
            header = _HeaderUnpickler(io.BytesIO(archive.read(names[0]))).load()
    except PromptEmbedsError:
        raise
    except Exception as exc:  # any malformed archive or pickle: the client's bad input
        raise PromptEmbedsError(f"prompt_embeds is not a torch.save archive ({exc})") from None
    if not isinstance(header, TensorHeader):
        raise PromptEmbedsError("prompt_embeds must hold one tensor")
    return data, header
