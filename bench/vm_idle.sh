#!/usr/bin/env bash
# An idle start on this machine for several git revisions in turn, in one run (the VM's IDLE_TRACE=1
# bench/device_gap.sh): bench/idle_timeline.py (as root, tracefs) and workload B, two rounds.
#   sudo bash bench/vm_idle.sh OUT NAME=REV...    e.g. bash bench/vm_idle.sh /tmp/idle base=5bb972f now=main
# Each revision runs from a temporary git worktree, installed as users get it (bench.peers.gpuq.install_regular).
# NO_B=1: the timeline only. Results: OUT/NAME-ROUND.json (the timeline's milestones), OUT/harness-NAME-ROUND/, OUT/summary.txt.
set -u
out=$1; shift
mkdir -p "$out"
here=$(cd "$(dirname "$0")/.." && pwd)
python=$here/.venv/bin/python
tmp=$(mktemp -d /tmp/gpuq-vm-idle.XXXXXX)
exec > >(tee "$out/summary.txt") 2>&1
date -u; nproc; uname -r; uptime; ldd --version | head -1
for pair in "$@"; do name=${pair%%=*}; rev=${pair#*=}
  git -C $here worktree remove --force $tmp/$name 2>/dev/null
  git -C $here worktree add -q --detach $tmp/$name $rev && git -C $tmp/$name log --oneline -1
  (cd $tmp/$name && $python -c "
import sys; sys.path.insert(0,'.')
from pathlib import Path
from bench.peers.gpuq import install_regular
cmd, what = install_regular(Path('$tmp/inst-$name')); print(cmd or what)
" > $tmp/cmd-$name)
  echo "$name: $(cat $tmp/cmd-$name)"
done
for round in 1 2; do
  for pair in "$@"; do name=${pair%%=*}
    (cd $tmp/$name && GPUQ_BENCH_COMMAND=$(cat $tmp/cmd-$name) timeout 300 $python $here/bench/idle_timeline.py --label "$name-$round" --runs 10 --out "$out" 2>&1 | tail -4 | sed "s/^/$name round $round: /")
  done
  [ -n "${NO_B:-}" ] && continue
  for pair in "$@"; do name=${pair%%=*}
    (cd $tmp/$name && GPUQ_BENCH_COMMAND=$(cat $tmp/cmd-$name) timeout 300 $python bench/harness.py --tools gpuq --workloads B --repeat 3 --out "$out/harness-$name-$round" 2>&1 | grep " gpuq:" | sed "s/^/$name round $round: /")
  done
done
uptime; date -u
for pair in "$@"; do name=${pair%%=*}; git -C $here worktree remove --force $tmp/$name; done
rm -rf "$tmp"
