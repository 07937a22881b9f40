#!/usr/bin/env bash
# Issue 37's GPU checks in one device call, from a plain copy of the tree (nothing is
# installed there). Here, once: `make gpu-wheels` (the packages the machine's image
# lacks, into .whl/); then run `bash bench/gpu_check.sh` there with `carry: [".whl"]`.
# In order, each bounded so the whole ends inside one 10-minute call: the model runner
# and engine script (bench.gpu_engine, the headline table), the GPU tests
# (pytest -m gpu), the kernel script (bench.gpu_attention). Logs and JSON go to $OUT
# (bench/results/gpu when unset). Exit status 0 only when all three passed.
set -u
python=${PYTHON:-python3}
out=${OUT:-bench/results/gpu}
mkdir -p "$out"
site=$(mktemp -d)
if compgen -G ".whl/*.whl" >/dev/null; then
  "$python" -m pip install -q --no-index --no-deps --target "$site" .whl/*.whl
fi
export PYTHONPATH=".:$site" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader \
  >"$out/device.txt" 2>&1
cat "$out/device.txt"
status=0

step() {  # step NAME SECONDS COMMAND...: run it under a limit, log it, note failures
  local name=$1 limit=$2
  shift 2
  echo "== $name (at most ${limit} s)"
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  tail -n 40 "$out/$name.log"
  echo "== $name: exit $rc"
  [ "$rc" -eq 0 ] || status=1
}

step gpu-engine 200 "$python" -m bench.gpu_engine --json "$out/engine.json"
step pytest-gpu 180 "$python" -m pytest -q -p no:cacheprovider -m gpu \
  $(grep -rl "pytest.mark.gpu" tests)
step gpu-attention 150 "$python" -m bench.gpu_attention --json "$out/attention.json"
exit $status
