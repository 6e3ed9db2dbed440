#!/usr/bin/env bash
# Where a hand-off's time goes on a lent GPU host, two or more revisions side by side in one call (the `device`
# tool runs it from the checkout's root, as root):
#   TARS     `git archive --prefix=NAME/` files of the revisions, e.g. ".whl/main.tar .whl/handgap.tar", made here
#            with `git archive --prefix=main/ -o .whl/main.tar main` (and so on); the last one runs the benches
#   ROUNDS   how many times the revisions run in turn (default 3), each run `bench/harness.py --workloads A --repeat 3`
# Then, on one clock, the steps of a hand-off for each revision in turn (bench/handoff_timeline.py: the real shim,
# the kernel's exits, execs and forks from tracefs), and what the cpu and memory controllers gpuq hands down to
# every job's cgroup cost its start and end (bench/controller_cost.py). Each revision is installed in place for
# its runs (a venv would not see the image's packages). Results: $OUT/res.tgz, the summary in $OUT/device.log.
set -u
res=/tmp/res && rm -rf "$res" && mkdir -p "$res"
exec > >(tee "$OUT/device.log") 2>&1
export PYTHONUNBUFFERED=1
date -u; nvidia-smi -L; nproc; uname -r; python3 --version; ldd --version | head -1; cat /sys/fs/cgroup/cgroup.subtree_control
names=() trees=()
for tar in ${TARS}; do
    tar xf "$tar" -C /tmp
    name=$(basename "$tar" .tar); names+=("$name"); trees+=(--tree "$name=/tmp/$name")
done
last=${names[-1]}
for round in $(seq "${ROUNDS:-3}"); do
    for name in "${names[@]}"; do
        python3 -m pip install -q --no-deps --no-build-isolation -e "/tmp/$name" 2>&1 | tail -2
        (cd "/tmp/$name" && GPUQ_BENCH_COMMAND=$(command -v gpuq) timeout 120 python3 bench/harness.py \
            --tools gpuq --workloads A --repeat 3 --out "$res/harness-$name-$round" 2>&1 | grep "A gpuq" \
            | sed "s/^/$name round $round: /")
    done
done
(cd "/tmp/$last" && timeout 240 python3 bench/handoff_timeline.py --no-self "${trees[@]}" --rounds "${ROUNDS:-3}" \
    --out "$res/timeline" 2>&1 | tail -22)
(cd "/tmp/$last" && timeout 90 python3 bench/controller_cost.py 100 2>&1 | tee "$res/controller_cost.txt")
date -u
tar czf "$OUT/res.tgz" -C /tmp res
