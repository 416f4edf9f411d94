"""vLLM's own pure-Python modules of one release, fetched from PyPI and loaded in isolation.

vLLM's wheels are CUDA builds of 250-390 MB; the modules the worker talks to (the KV event
structs and ``ZmqEventPublisher``, ``SamplingParams``) are plain Python. ``fetch`` reads only
those files out of the release's x86_64 wheel on PyPI with HTTP range requests (the zip's
central directory, then each file: a few hundred KB in all, about a second) and caches them
under ``$JETFLEET_VLLM_SOURCES`` (default ``~/.cache/jetfleet/vllm-sources/<release>/``).

``loaded(release)`` imports them as ``vllm.*`` for the duration of a ``with`` block: the fetched
files are executed as they are; every other ``vllm`` module they import (the logger, configs,
tokenizers, torch helpers) is a stub, since what the tests drive never reaches those. An
installed vLLM is put aside for the block and restored after it.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import io
import json
import logging
import os
import sys
import types
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SIMPLE_INDEX = "https://pypi.org/simple/vllm/"
# The modules the compatibility tests drive, and pure modules they import.
FILES = (
    "vllm/distributed/kv_events.py",
    "vllm/sampling_params.py",
    "vllm/envs.py",
    "vllm/exceptions.py",
)
# Read as text only (parsed, never imported: they import torch and CUDA extensions).
TEXT_FILES = (
    "vllm/v1/engine/async_llm.py",
    "vllm/v1/engine/core.py",
    "vllm/v1/metrics/stats.py",
    "vllm/outputs.py",
    "vllm/pooling_params.py",
    "vllm/engine/arg_utils.py",
    "vllm/config/kv_events.py",
    "vllm/config.py",  # 0.10.0: one module, KVEventsConfig inside
)


def cache_dir() -> Path:
    default = Path.home() / ".cache" / "jetfleet" / "vllm-sources"
    return Path(os.environ.get("JETFLEET_VLLM_SOURCES", default))


class _HttpRangeFile(io.RawIOBase):
    """A read-only, seekable view of a remote file: each read is one HTTP range request."""

    def __init__(self, url: str, timeout_s: float = 60.0) -> None:
        self._url, self._timeout = url, timeout_s
        head = urllib.request.Request(url, method="HEAD")
        with urllib.request.urlopen(head, timeout=timeout_s) as resp:
            self._size = int(resp.headers["Content-Length"])
        self._pos = 0

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = base + offset
        return self._pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer)
        if not len(view) or self._pos >= self._size:
            return 0
        end = min(self._size, self._pos + len(view)) - 1
        req = urllib.request.Request(self._url, headers={"Range": f"bytes={self._pos}-{end}"})
        with urllib.request.urlopen(req, timeout=self._timeout) as resp:
            data = resp.read()
        view[: len(data)] = data
        self._pos += len(data)
        return len(data)


def wheel_url(release: str) -> str:
    """The release's x86_64 Linux wheel on PyPI (PEP 691 JSON simple index)."""
    req = urllib.request.Request(
        SIMPLE_INDEX, headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        files = json.load(resp)["files"]
    prefix = f"vllm-{release}-cp"
    for f in files:
        name = f["filename"]
        if name.startswith(prefix) and name.endswith("x86_64.whl"):
            return str(f["url"])
    raise LookupError(f"no x86_64 wheel of vllm {release} on PyPI")


def fetch(release: str) -> Path:
    """The release's ``FILES`` (under ``<root>/vllm/``) and ``TEXT_FILES`` (under
    ``<root>/text/vllm/``) in the cache, fetched once; returns ``<root>``. A file the release
    does not have is left out."""
    root = cache_dir() / release
    done = root / ".complete"  # what was asked for: a longer list later fetches again
    requested = sorted((*FILES, *TEXT_FILES))
    marker: Any = json.loads(done.read_text()) if done.exists() else None
    if isinstance(marker, dict) and marker.get("requested") == requested:
        return root
    wheel = zipfile.ZipFile(io.BufferedReader(_HttpRangeFile(wheel_url(release)), 1 << 20))
    names = set(wheel.namelist())
    wanted = [(name, root / name) for name in FILES]
    wanted += [(name, root / "text" / name) for name in TEXT_FILES]
    for name, target in wanted:
        if name in names:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(wheel.read(name))
    found = sorted(n for n, _ in wanted if n in names)
    done.write_text(json.dumps({"requested": requested, "found": found}))
    return root


def source_text(release: str, name: str) -> str | None:
    """A ``TEXT_FILES`` entry of the release, or None where the release has no such file."""
    path = fetch(release) / "text" / name
    return path.read_text() if path.exists() else None


# ------------------------------------------------------------------------------------ loading
class _Stub(types.ModuleType):
    """A vLLM module that was not fetched: any name it is asked for is a stand-in."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.__path__: list[str] = []  # a package too, so submodules import

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        value: Any
        if attr[:1].isupper():  # a class: a base, a type in an annotation, an exception
            is_error = attr.endswith("Error")
            value = type(attr, (Exception,) if is_error else (_Anything,), {})
        else:  # a function or decorator: returns a class it decorates, else nothing
            value = _passthrough
        setattr(self, attr, value)
        return value


class _Anything:
    """Takes any arguments and keeps the keyword ones (a config class built for the record)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.__dict__.update(kwargs)


def _passthrough(*args: Any, **kwargs: Any) -> Any:
    return args[0] if len(args) == 1 and isinstance(args[0], type) else None


_KNOWN_STUBS: dict[str, dict[str, Any]] = {
    "vllm": {},  # ``__version__`` is set per release by ``loaded``
    "vllm.logger": {"init_logger": logging.getLogger},
    "vllm.v1.core.kv_cache_utils": {"ExternalBlockHash": bytes | int},
}


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, root: Path, release: str) -> None:
        self.root, self.release = root, release

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != "vllm" and not fullname.startswith("vllm."):
            return None
        file = self.root / (fullname.replace(".", "/") + ".py")
        if file.exists():
            return importlib.util.spec_from_file_location(fullname, file)
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _Stub(spec.name)
        for attr, value in _KNOWN_STUBS.get(spec.name, {}).items():
            setattr(module, attr, value)
        if spec.name == "vllm":
            module.__version__ = self.release  # type: ignore[attr-defined]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def _fetched(module: types.ModuleType) -> bool:
    """A module ``loaded`` made: a stub, or one of the fetched sources."""
    spec = getattr(module, "__spec__", None)
    if spec is None:
        return False
    return isinstance(spec.loader, _Finder) or str(spec.origin or "").startswith(str(cache_dir()))


@contextlib.contextmanager
def loaded(release: str) -> Iterator[types.SimpleNamespace]:
    """``kv_events`` and ``sampling_params`` of ``release`` as modules, within the block."""
    root = fetch(release)
    # A real vLLM imported before is put aside while any block is open and put back when the
    # last one closes: two of these blocks may overlap and pytest may end them in any order, and
    # a real vLLM module dropped on the way would run again on its next import (torch refuses a
    # second registration of its opaque types).
    if not _open_blocks:
        _real.update(
            (k, v)
            for k, v in sys.modules.items()
            if (k == "vllm" or k.startswith("vllm.")) and not _fetched(v)
        )
    _open_blocks.append(release)
    _drop_vllm_modules()
    finder = _Finder(root, release)
    sys.meta_path.insert(0, finder)
    try:
        yield types.SimpleNamespace(
            release=release,
            kv_events=importlib.import_module("vllm.distributed.kv_events"),
            sampling_params=importlib.import_module("vllm.sampling_params"),
        )
    finally:
        sys.meta_path.remove(finder)
        _drop_vllm_modules()
        _open_blocks.remove(release)
        if not _open_blocks:
            sys.modules.update(_real)
            _real.clear()


_real: dict[str, types.ModuleType] = {}  # the installed vLLM's modules, while blocks are open
_open_blocks: list[str] = []


def _drop_vllm_modules() -> None:
    for name in [k for k in sys.modules if k == "vllm" or k.startswith("vllm.")]:
        del sys.modules[name]
