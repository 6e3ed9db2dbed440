#!/bin/sh
# The benchmark job: job.sh OUT SECONDS [GPUS]
# Stamps its start and end (date +%s.%N) and the GPU ids it was given ($CUDA_VISIBLE_DEVICES) as one
# line appended to OUT, and sleeps SECONDS in between. A plain shell script: an interpreter's start-up
# would dominate a 0.2 s job. OUT appears only when the job has ended; two lines in it mean it ran twice.
#
# For a tool with slots but no GPUs (task-spooler), BENCH_GPU_LOCKS names a directory of lock files, one
# per GPU (BENCH_GPU_COUNT of them, at most 7): the job takes GPUS free ones with flock before it stamps
# its start, so picking a GPU counts as the tool's dispatch time, not the job's. Locks die with the job.
# Each `flock` is a process (ms here), so a job first tries the GPUs the last job to end has just freed
# (it leaves their ids in BENCH_GPU_LOCKS/freed): one flock in the usual case, a scan otherwise.
out=$1 seconds=$2 need=${3:-1}
if [ -n "$BENCH_GPU_LOCKS" ]; then
    count=${BENCH_GPU_COUNT:-4}
    hint=
    [ -r "$BENCH_GPU_LOCKS/freed" ] && read -r hint < "$BENCH_GPU_LOCKS/freed"
    all= i=0
    while [ "$i" -lt "$count" ]; do all="$all $i"; i=$((i + 1)); done
    while :; do
        tried= have=0 CUDA_VISIBLE_DEVICES=
        saved_ifs=$IFS
        IFS=', '
        for g in $hint $all; do
            case " $tried " in *" $g "*) continue ;; esac
            tried="$tried $g"
            eval "exec $((g + 3))>\"\$BENCH_GPU_LOCKS/gpu$g\""
            if flock -n $((g + 3)); then
                CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES${CUDA_VISIBLE_DEVICES:+,}$g
                have=$((have + 1))
                [ "$have" -ge "$need" ] && break
            else
                eval "exec $((g + 3))>&-"
            fi
        done
        IFS=$saved_ifs
        [ "$have" -ge "$need" ] && break
        # Cannot happen while the tool respects its slots: let go, wait and try again rather than share.
        for g in $all; do eval "exec $((g + 3))>&-"; done
        sleep 0.001
    done
    export CUDA_VISIBLE_DEVICES
fi
s=$(date +%s.%N)
sleep "$seconds"
e=$(date +%s.%N)
echo "$s $e $CUDA_VISIBLE_DEVICES" >> "$out"
if [ -n "$BENCH_GPU_LOCKS" ]; then
    echo "$CUDA_VISIBLE_DEVICES" > "$BENCH_GPU_LOCKS/freed"
fi
