#!/usr/bin/env bash
# One call on a lent GPU host (the `device` tool runs it from the checkout's root, as root): every GPU test,
# containment on real cgroup2 with controllers, two users' packed jobs under real MPS, the fence, and what
# the watchdog and a job's cgroup cost. Results go to $OUT/res.tgz, the summary to $OUT/device.log.
# It changes no device setting, and quits every MPS daemon it started (the tests and benches do; checked last).
set -u
cd "$(dirname "$0")/.."
res=/tmp/res && rm -rf "$res" && mkdir -p "$res"
exec > >(tee "$OUT/device.log") 2>&1
export PYTHONUNBUFFERED=1
date -u; nvidia-smi -L; nproc; python3 --version
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
step() { echo "== $*"; "$@"; echo "== rc=$?"; }
step timeout 300 python3 -m pytest -q -rs -m gpu -p no:cacheprovider tests 2>&1 | tee "$res/pytest_gpu.log" | tail -25
step timeout 240 python3 -m pytest -q -rs -p no:cacheprovider tests/test_containment.py 2>&1 | tee "$res/containment.log" | tail -12
step timeout 240 python3 bench/gpu_validation.py --users --out "$res" 2>&1 | tail -15
step timeout 120 python3 bench/watchdog_cost.py --cuda 16 --json "$res/watchdog_cost.json" 2>&1 | tail -12
step timeout 120 python3 bench/containment_cost.py 200 2>&1 | tee "$res/containment_cost.txt" | tail -8
step timeout 300 python3 bench/gpu_validation.py --fence --out "$res" 2>&1 | tail -15
echo "== MPS processes left: $(ps -eo pid,comm | grep -i mps || echo none)"
date -u
tar czf "$OUT/res.tgz" -C /tmp res
