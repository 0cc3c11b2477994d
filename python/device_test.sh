#!/usr/bin/env bash
# The Python package on the GPU machine, in one command:
#   bash python/device_test.sh [--pip] [-- extra pytest args]
# 1. builds the nanobind module and the CLI against the CUDA build
#    (cmake + ninja, build dir build-device-py, tests of the C++ side off);
# 2. runs the whole pytest suite (tests/python) with PYTHONPATH at that build —
#    the GPU tests (ops vs the host path, torch.compile, CUDA-graph capture and
#    replay, the vLLM adapter vs the native loader) run when torch sees a GPU;
# 3. with --pip: `pip install --no-build-isolation --no-deps` of the package
#    into a throwaway prefix (CUDA on), then imports it and runs the installed
#    `nvfp4moe` CLI.
# Nothing is downloaded. Logs go to $OUT (or build-device-py/logs); the
# summary is printed last.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-$(command -v python3)}
LOGS=${OUT:-$ROOT/build-device-py/logs}
mkdir -p "$LOGS"
DO_PIP=0
PYTEST_ARGS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --pip) DO_PIP=1 ;;
    --) shift; PYTEST_ARGS=("$@"); break ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
  shift
done
JOBS=$(nproc)
summary=()

echo "== python: $PY ($("$PY" -c 'import torch, nanobind; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), "nanobind", nanobind.__version__)'))"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true

echo "== configure + build (CUDA on)"
start=$(date +%s)
cmake -S . -B build-device-py -G Ninja -DCMAKE_BUILD_TYPE=Release -DNVFP4MOE_BUILD_TESTS=OFF \
  -DNVFP4MOE_BUILD_PYTHON=ON -DPython_EXECUTABLE="$PY" 2>&1 | tee "$LOGS/py_configure.log" | grep "nvfp4moe:"
grep -q "CUDA backend ON" "$LOGS/py_configure.log" || { echo "nvcc not found: the CUDA build is required here" >&2; exit 1; }
grep -q "Python module ON" "$LOGS/py_configure.log" || {
  echo "the Python module was not configured (Python headers or nanobind missing):" >&2
  grep -i "python" "$LOGS/py_configure.log" >&2; exit 1; }
ninja -C build-device-py -j "$JOBS" nvfp4moe_C nvfp4moe_cli > "$LOGS/py_build.log" 2>&1 || { tail -40 "$LOGS/py_build.log"; exit 1; }
summary+=("build: $(( $(date +%s) - start )) s")

echo "== pytest tests/python"
set +e
PYTHONPATH=$ROOT/build-device-py/python NVFP4MOE_CLI=$ROOT/build-device-py/nvfp4moe \
  "$PY" -m pytest -p no:cacheprovider -rs -v tests/python "${PYTEST_ARGS[@]}" 2>&1 | tee "$LOGS/pytest.log"
rc=${PIPESTATUS[0]}
set -e
summary+=("pytest: rc=$rc, $(grep -E '^(=+ )?[0-9]+ (passed|failed)' "$LOGS/pytest.log" | tail -1)")

if [[ $DO_PIP == 1 ]]; then
  echo "== pip install (CUDA on) into a throwaway prefix"
  start=$(date +%s)
  PREFIX=$(mktemp -d)
  set +e
  "$PY" -m pip install --no-build-isolation --no-deps --prefix "$PREFIX" -C build-dir=build-device-pip . \
    > "$LOGS/pip.log" 2>&1
  prc=$?
  set -e
  if [[ $prc == 0 ]]; then
    SITE=$(find "$PREFIX" -name site-packages -type d | head -1)
    PYTHONPATH=$SITE "$PY" -c 'import nvfp4moe; print("installed:", nvfp4moe.__file__, "cuda:", nvfp4moe.built_with_cuda, nvfp4moe.cuda_available())' | tee -a "$LOGS/pip.log"
    "$PREFIX/bin/nvfp4moe" --help > /dev/null 2>&1 && echo "CLI on the scripts path: $PREFIX/bin/nvfp4moe" | tee -a "$LOGS/pip.log"
  else
    tail -30 "$LOGS/pip.log"
  fi
  summary+=("pip install: rc=$prc, $(( $(date +%s) - start )) s")
fi

echo "== summary"
printf '  %s\n' "${summary[@]}"
exit "$rc"
