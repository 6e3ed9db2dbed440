#!/usr/bin/env bash
# Workload A's gap on a lent host, for several revisions side by side in one call (the `device` tool runs it
# from the checkout's root, as root):
#   TARS     `git archive --prefix=NAME/` files of the revisions, e.g. ".whl/base.tar .whl/born.tar"
#   ROUNDS   how many times the revisions run in turn (default 2), each run `--repeat 3`
#   IDLE     if set, also workload B with --quick (its idle submit -> start, 5 runs a repeat) each time
#   IDLE_TRACE  if set, also bench/idle_timeline.py (this checkout's) on each revision each round
#   NO_A     if set, no workload A
#   NO_COST  if set, not the cost below
# and what one start in a cgroup costs at the last revision (bench/containment_cost.py). Each revision is
# installed in place for its runs (a venv would not see the image's packages). Results: $OUT/res.tgz, the
# summary in $OUT/device.log.
set -u
res=/tmp/res && rm -rf "$res" && mkdir -p "$res"
exec > >(tee "$OUT/device.log") 2>&1
export PYTHONUNBUFFERED=1
date -u; nvidia-smi -L; nproc; uname -r; python3 --version
last=""
for tar in ${TARS}; do tar xf "$tar" -C /tmp; done
for round in $(seq "${ROUNDS:-2}"); do
    for tar in ${TARS}; do
        name=$(basename "$tar" .tar); last=$name
        python3 -m pip install -q --no-deps --no-build-isolation -e "/tmp/$name" 2>&1 | tail -2
        [ -z "${NO_A:-}" ] && (cd "/tmp/$name" && GPUQ_BENCH_COMMAND=$(command -v gpuq) timeout 120 python3 \
            bench/harness.py --tools gpuq --workloads A --repeat 3 --out "$res/harness-$name-$round" 2>&1 \
            | grep "A gpuq" | sed "s/^/$name round $round: /")
        if [ -n "${IDLE_TRACE:-}" ]; then
            GPUQ_BENCH_COMMAND=$(command -v gpuq) timeout 120 python3 bench/idle_timeline.py --label "$name-$round" \
                --runs "${IDLE_RUNS:-12}" --out "$res/idle" 2>&1 | tail -12
        fi
        if [ -n "${IDLE:-}" ]; then
            (cd "/tmp/$name" && GPUQ_BENCH_COMMAND=$(command -v gpuq) timeout 150 python3 bench/harness.py \
                --tools gpuq --workloads B --quick --repeat 3 --out "$res/harness-b-$name-$round" 2>&1 \
                | grep "B gpuq" | sed "s/^/$name round $round: /")
        fi
    done
done
[ -z "${NO_COST:-}" ] && (cd "/tmp/$last" && timeout 90 python3 bench/containment_cost.py 60 2>&1 | tee "$res/containment_cost.txt" | tail -8)
date -u
tar czf "$OUT/res.tgz" -C /tmp res
