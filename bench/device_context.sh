#!/usr/bin/env bash
# One call on a lent GPU host for #40's context-kept path (a whole-GPU job whose fast release left only its
# context keeps it on its GPU, frozen: no driver's checkpoint nor restore): the graphed bit-identical GPU test
# (kill -9 of the daemon while suspended) and the 100 GiB bar beside the driver's path on the same job
# (bench/gpu_pool100.py). bench/device_issue40.sh without its --mem auto run. Results under $OUT.
# It changes no device setting; the test and the bench start no MPS daemon (checked last).
set -u
cd "$(dirname "$0")/.."
exec > >(tee "$OUT/device.log") 2>&1
export PYTHONUNBUFFERED=1
date -u; nvidia-smi -L; nproc; python3 --version; git log --oneline -1 2>/dev/null || true
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
step() { echo "== $*"; "$@"; echo "== rc=$?"; }
step timeout -s INT 100 python3 -m pytest -q -rA -m gpu -p no:cacheprovider \
  "tests/test_suspend_gpu.py::test_a_training_run_suspended_on_the_fast_path_then_resumed_by_a_daemon_restarted_after_kill_9_is_bit_identical[graphed]" \
  2>&1 | tee "$OUT/pytest_gpu.log" | tail -15
step timeout -s INT 215 python3 bench/gpu_pool100.py --out "$OUT/pool100.json" --driver-after 150
echo "== MPS processes left: $(ps -eo pid,comm | grep -i mps || echo none)"
date -u
