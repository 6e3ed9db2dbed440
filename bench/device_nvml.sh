#!/usr/bin/env bash
# What NVML costs gpuq's dispatch on a lent GPU host, for several revisions side by side in one call (the
# `device` tool runs it from the checkout's root, as root):
#   TARS     `git archive --prefix=NAME/` files of the revisions, e.g. ".whl/before.tar .whl/after.tar"
#   ROUNDS   how many times the revisions run in turn (default 2)
#   NO_TESTS if set, not `pytest -m gpu` at this checkout
#   NO_COST  if set, not the watchdog's cost
# Each round runs workloads A and B (--quick, --repeat 3) of each revision's harness with gpuq on the host's
# real GPUs (GPUQ_BENCH_REAL_GPUS=1), each revision installed in place for its runs. Once: each NVML call's
# cost (bench/nvml_cost.py), and at this checkout every GPU test and the watchdog's cost with 16 CUDA
# processes. Results: $OUT/res.tgz, the summary in $OUT/device.log. It changes no device setting.
set -u
res=/tmp/res && rm -rf "$res" && mkdir -p "$res"
exec > >(tee "$OUT/device.log") 2>&1
export PYTHONUNBUFFERED=1
date -u; nvidia-smi -L; nproc; uname -r; python3 --version
here=$(pwd)
python3 bench/nvml_cost.py --passes 50 --json "$res/nvml_cost.json" > /dev/null && python3 -c "
import json, sys
d = json.load(open(sys.argv[1]))
print('per call, GPU 0:', {k: v.get('cpu_us', v.get('error')) for k, v in d['per_gpu']['0'].items()})
print({k: v for k, v in d.items() if k.startswith('snapshot')})" "$res/nvml_cost.json"
for tar in ${TARS}; do tar xf "$tar" -C /tmp; done
for round in $(seq "${ROUNDS:-2}"); do
    for tar in ${TARS}; do
        name=$(basename "$tar" .tar)
        python3 -m pip install -q --no-deps --no-build-isolation -e "/tmp/$name" 2>&1 | tail -2
        (cd "/tmp/$name" && GPUQ_BENCH_REAL_GPUS=1 GPUQ_BENCH_COMMAND=$(command -v gpuq) timeout 150 python3 \
            bench/harness.py --tools gpuq --workloads A,B --quick --repeat 3 --out "$res/harness-$name-$round" 2>&1 \
            | grep -E "(A|B) gpuq" | sed "s/^/$name round $round: /")
    done
done
python3 -m pip install -q --no-deps --no-build-isolation -e "$here" 2>&1 | tail -2
if [ -z "${NO_TESTS:-}" ]; then
    timeout 300 python3 -m pytest -q -rs -m gpu -p no:cacheprovider tests 2>&1 | tee "$res/pytest_gpu.log" | tail -6
fi
if [ -z "${NO_COST:-}" ]; then
    timeout 120 python3 bench/watchdog_cost.py --cuda 16 --json "$res/watchdog_cost.json" > /dev/null 2>&1
    python3 -c "
import json, sys
d = json.load(open(sys.argv[1]))['nvml']
print({state: {k: v['median_ms'] for k, v in d[state].items() if isinstance(v, dict)} for state in ('idle', 'busy')})
" "$res/watchdog_cost.json"
fi
echo "== MPS processes left: $(ps -eo pid,comm | grep -i mps || echo none)"
date -u
tar czf "$OUT/res.tgz" -C /tmp res
