#!/usr/bin/env bash
# Workload A's gap for several git revisions in turn on this machine, in one run (the VM's bench/device_gap.sh):
#   bash bench/vm_gap.sh OUT REV...        e.g. bash bench/vm_gap.sh bench/results/vm-handgap main handgap
#   ROUNDS   how many times the revisions run in turn (default 2), each run `bench/harness.py --repeat 3`
#   WORKLOADS the harness's workloads (default A); HARNESS_ARGS more of its arguments (e.g. --quick)
#   TIMELINE 1: also bench/handoff_timeline.py (as root, tracefs) on the revisions, ROUNDS rounds of it
# Each revision runs from a temporary git worktree with this checkout's .venv, installed as users get it (the
# harness does that). Results: OUT/harness-REV-ROUND/ and OUT/summary.txt.
set -u
out=$1; shift
mkdir -p "$out"
here=$(cd "$(dirname "$0")/.." && pwd)
python=$here/.venv/bin/python
tmp=$(mktemp -d /tmp/gpuq-vm-gap.XXXXXX)
trap 'for rev in "$@"; do git -C "$here" worktree remove --force "$tmp/$rev" 2>/dev/null; done; rm -rf "$tmp"' EXIT
exec > >(tee "$out/summary.txt") 2>&1
date -u; nproc; uname -r; uptime
for rev in "$@"; do git -C "$here" worktree add -q --detach "$tmp/$rev" "$rev" && git -C "$tmp/$rev" log --oneline -1; done
for round in $(seq "${ROUNDS:-2}"); do
    for rev in "$@"; do
        # shellcheck disable=SC2086
        (cd "$tmp/$rev" && timeout 300 "$python" bench/harness.py --tools gpuq --workloads "${WORKLOADS:-A}" \
            --repeat 3 ${HARNESS_ARGS:-} --out "$out/harness-$rev-$round" 2>&1 | grep " gpuq:" \
            | sed "s/^/$rev round $round: /")
    done
done
if [ "${TIMELINE:-0}" = 1 ]; then
    trees=()
    for rev in "$@"; do trees+=(--tree "$rev=$tmp/$rev"); done
    timeout 900 "$python" "$here/bench/handoff_timeline.py" --no-self --rounds "${ROUNDS:-2}" "${trees[@]}" \
        --out "$out/timeline" 2>&1 | tail -25
fi
uptime; date -u
