#!/usr/bin/env bash
# One call on a lent GPU host (the `device` tool runs it from the checkout's root, as root): the GPU tests,
# automatic preemption's scenarios (bench/gpu_preempt.py, SCENARIOS: "b d" by default), and what starting
# a job in its cgroup costs, cloned into it against moved in and out (bench/containment_cost.py).
# Results go to $OUT/res.tgz, the summary to $OUT/device.log. It changes no device setting; the benches quit
# every MPS daemon they start (checked last).
set -u
cd "$(dirname "$0")/.."
res=/tmp/res && rm -rf "$res" && mkdir -p "$res"
exec > >(tee "$OUT/device.log") 2>&1
export PYTHONUNBUFFERED=1
date -u; nvidia-smi -L; nproc; uname -r; python3 --version
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
step() { echo "== $*"; "$@"; echo "== rc=$?"; }
if [ -z "${SKIP_TESTS:-}" ]; then
    step timeout 240 python3 -m pytest -q -rs -m gpu -p no:cacheprovider tests 2>&1 | tee "$res/pytest_gpu.log" | tail -25
fi
for scenario in ${SCENARIOS:-b d}; do
    step timeout 200 python3 bench/gpu_preempt.py --only "$scenario" --out "$res/gpu_preempt-$scenario.json" 2>&1 | tail -25
done
step timeout 60 python3 bench/containment_cost.py 60 2>&1 | tee "$res/containment_cost.txt" | tail -8
echo "== MPS processes left: $(ps -eo pid,comm | grep -i mps || echo none)"
date -u
tar czf "$OUT/res.tgz" -C /tmp res
