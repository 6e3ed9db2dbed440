#!/usr/bin/env bash
# One call on a lent GPU host (the `device` tool runs it from the checkout's root, as root). Each part is
# chosen by a variable, so that one call fits the time a call may take:
#   TESTS        pytest arguments for the GPU tests (default: -m gpu tests; "" skips them)
#   SCENARIOS    bench/gpu_preempt.py's scenarios, one run each (default "b d"; "" skips them)
#   SUSPEND      bench/gpu_suspend.py's sizes in GiB, PAIRS cycles through gpuq and as many bare (default: none)
#   BASE_TAR     a `git archive --prefix=base/` of an older revision: workload A of bench/harness.py on gpuq
#                at that revision and at this checkout, in turn (default: none)
# and always what starting a job in its cgroup costs, cloned against moved (bench/containment_cost.py).
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
tests=${TESTS--m gpu tests}
if [ -n "$tests" ]; then
    # shellcheck disable=SC2086
    step timeout 240 python3 -m pytest -q -rs -p no:cacheprovider $tests 2>&1 | tee "$res/pytest_gpu.log" | tail -25
fi
for scenario in ${SCENARIOS-b d}; do
    step timeout 200 python3 bench/gpu_preempt.py --only "$scenario" --out "$res/gpu_preempt-$scenario.json" 2>&1 | tail -25
done
if [ -n "${SUSPEND:-}" ]; then
    # gpuq installed as users have it (not editable: setuptools' editable finder costs every interpreter's
    # start ~20 ms), and its `gpuq` command timed; the editable install again after.
    python3 -m pip install -q --no-deps --no-build-isolation . 2>&1 | tail -2
    # shellcheck disable=SC2086
    GPUQ_BENCH_COMMAND=$(command -v gpuq) step timeout 500 python3 bench/gpu_suspend.py --sizes $SUSPEND \
        --pairs "${PAIRS:-2}" --out "$res/gpu_suspend.json" 2>&1 | grep '"median"' | tail -6
    python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
fi
if [ -n "${BASE_TAR:-}" ]; then
    # The older revision is installed in place of this one for its runs (a venv would not see the image's
    # packages, installed for the user), then this checkout again.
    tar xf "$BASE_TAR" -C /tmp
    for round in 1 2; do
        python3 -m pip install -q --no-deps --no-build-isolation -e /tmp/base 2>&1 | tail -2
        (cd /tmp/base && GPUQ_BENCH_COMMAND=$(command -v gpuq) step timeout 100 python3 bench/harness.py \
            --tools gpuq --workloads A --repeat 3 --out "$res/harness-base-$round" 2>&1 | grep "A gpuq")
        python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
        GPUQ_BENCH_COMMAND=$(command -v gpuq) step timeout 100 python3 bench/harness.py --tools gpuq --workloads A \
            --repeat 3 --out "$res/harness-head-$round" 2>&1 | grep "A gpuq"
    done
fi
step timeout 60 python3 bench/containment_cost.py 60 2>&1 | tee "$res/containment_cost.txt" | tail -8
echo "== MPS processes left: $(ps -eo pid,comm | grep -i mps || echo none)"
date -u
tar czf "$OUT/res.tgz" -C /tmp res
