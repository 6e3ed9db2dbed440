#!/usr/bin/env bash
# On a lent GPU host, in one call (the `device` tool runs it as root): each fast-start part's gain on workload A's
# gap at the revision BEFORE/ (bench/faststart.py), then workload A side by side with both peers at AFTER/:
#   DIR      a folder holding before/ and after/ (`git archive` trees) and peers/ (task-spooler's .deb and
#            simple_gpu_scheduler's wheel: the host reaches nothing outside)
#   ROUNDS   bench/faststart.py's rounds (default 3), REPEAT its runs a turn (default 1)
#   PARTS    the parts switched off in turn (default handoff,files,born,zygote)
# Results: $OUT/res.tgz, the summary in $OUT/device.log.
set -u
res=/tmp/res && rm -rf "$res" && mkdir -p "$res"
exec > >(tee "$OUT/device.log") 2>&1
export PYTHONUNBUFFERED=1
date -u; nvidia-smi -L; nproc; uname -r; python3 --version; ldd --version | head -1
dpkg -x "$DIR"/peers/task-spooler_*.deb /tmp/tsp && export PATH=/tmp/tsp/usr/bin:$PATH
python3 -m pip install -q --no-deps --no-index "$DIR"/peers/simple_gpu_scheduler-*.whl 2>&1 | tail -2
for tree in before after; do
    python3 -m pip install -q --no-deps --no-build-isolation -e "$DIR/$tree" 2>&1 | tail -2
    export GPUQ_BENCH_COMMAND=$(command -v gpuq)
    if [ $tree = before ]; then
        (cd "$DIR/before" && timeout 150 python3 bench/faststart.py "$res/faststart" --rounds "${ROUNDS:-3}" \
            --repeat "${REPEAT:-1}" --parts "${PARTS:-handoff,files,born,zygote}")
    else
        (cd "$DIR/after" && timeout 100 python3 bench/harness.py --tools tsp,sgs,gpuq --workloads A --quick \
            --repeat 3 --out "$res/peers" 2>&1 | grep -E "A (tsp|sgs|gpuq)|skipped|ERROR")
        cat "$res"/peers/*.md | grep -E "^\| A "
    fi
done
date -u
tar czf "$OUT/res.tgz" -C /tmp res
