"""A job spec as a Slurm batch job: the sbatch command line, its environment and the batch script.

Pure: a spec, a cluster's settings and the ids gpuq gave the job in, a ``Batch`` out. Nothing here runs
a command or touches the disk (``jobs.slurm.commands`` runs sbatch; ``jobs.slurm.clusters`` records the result).

What translates, and what is refused because Slurm has nothing like it (one line, exit code 2):

    --gpus N          --gres=gpu:N (Slurm sets CUDA_VISIBLE_DEVICES); --gpus 0 hides every GPU, as locally
    --time            --time in whole minutes, rounded up (Slurm's unit); else the cluster's default time
    --name            --job-name
    --cwd, --env      --chdir, and sbatch runs with the captured environment and --export=ALL
    --array 0-49%8    --array=0-49%8; member k of gpuq array A is Slurm task k, gpuq job A+1+position
    --after           --dependency=afterok:... (afterany with --after-any), --kill-on-invalid-dep=yes
    --retries N       --requeue, and the batch script requeues itself after a failure, N times at most
    --mode torchrun   torchrun --standalone: it picks its own free port on the node
    --priority P<0    --nice=-P (only admins may raise a job's priority on a cluster: P>0 is refused)
    --cpus N          --cpus-per-task, rounded up to whole CPUs (Slurm's unit)
    --ram SIZE        --mem in MiB, rounded up (Slurm's --mem is host memory per node, as --ram is per job)
    --mem             refused: on a cluster every job gets whole GPUs (Slurm cannot share one by memory)
    --oom-retry       refused: it grows --mem; use --retries
    --notify          refused: no gpuq daemon watches cluster jobs; use sbatch's --mail-type in sbatch_flags
    --gpu-ids         refused: Slurm chooses which of a node's GPUs a job gets (--gpus is how many)
    any other option  refused, where ``jobs.options`` declares it and JobSpec has no field for it (nothing here
                      translates it yet)
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuq_scheduler.jobs.config import Cluster
from gpuq_scheduler.jobs.errors import BadInput
from gpuq_scheduler.jobs.model import JobSpec, Mode
from gpuq_scheduler.jobs.options import GPU_IDS, kept_options
from gpuq_scheduler.jobs.store.spool import ArrayPlan
from gpuq_scheduler.jobs.store.statedir import StateDir
from gpuq_scheduler.jobs.units import format_size

TASK = "${SLURM_ARRAY_TASK_ID}"  # what {index} becomes in an array member's command


@dataclass(frozen=True)
class Batch:
    """One sbatch call: run ``argv`` with ``env`` and ``script`` on its standard input."""

    argv: tuple[str, ...]  # from "sbatch" on; the script is read from stdin
    script: str
    env: Mapping[str, str]  # sbatch's environment, which --export=ALL hands to the job


def check(spec: JobSpec, cluster: Cluster) -> None:
    """Refuse what has no Slurm equivalent, before any id is taken or anything is sent."""
    where = f"on cluster {cluster.name}"
    if spec.mem_per_gpu is not None:
        raise BadInput(
            f"--mem {format_size(spec.mem_per_gpu)} shares a GPU by memory, which Slurm cannot do: {where} every job "
            "gets whole GPUs; drop --mem (pick GPUs big enough with e.g. --gres=gpu:a100:1 in sbatch_flags)"
        )
    if spec.oom_retry:
        raise BadInput(
            f"--oom-retry retries with more GPU memory, which {where} means a whole GPU already; "
            "use --retries N instead"
        )
    if spec.notify:
        raise BadInput(
            f"--notify runs on this machine's gpuq daemon, which does not watch jobs {where}; use sbatch's "
            "--mail-type=END in the cluster's sbatch_flags, or `gpuq wait ID && COMMAND`"
        )
    if spec.priority > 0:
        raise BadInput(
            f"--priority {spec.priority}: {where} only admins can raise a job's priority; leave it out, or lower "
            "other jobs with a negative --priority (sent as sbatch --nice)"
        )
    if spec.preemptible or spec.preempt_signal:
        raise BadInput(
            f"--preemptible suspends a job to this machine's host memory, which gpuq cannot do {where}; leave it out "
            "(Slurm's own preemption is the cluster's: ask its admins for a preemptible partition or QOS)"
        )
    pinned = spec.value(GPU_IDS)
    if pinned:
        raise BadInput(
            f"--gpu-ids {','.join(map(str, pinned))} names GPUs of this machine; {where} Slurm chooses which of a "
            f"node's GPUs a job gets: leave it out (--gpus {spec.gpus} asks for as many)"
        )
    defaults = {option.field: option for option in kept_options()}
    for key, value in spec.options.items():  # options declared in jobs.options alone: none is translated here
        option = defaults.get(key)
        if option is None or value != option.kept_default:
            flag = option.flag if option else "--" + key.replace("_", "-")
            raise BadInput(f"{flag}: nothing translates it to Slurm yet, so it would be lost {where}; leave it out")


def translate(
    spec: JobSpec,
    cluster: Cluster,
    *,
    job_id: int,
    state: StateDir,
    array: ArrayPlan | None = None,
    after: Sequence[str] = (),
) -> Batch:
    """The sbatch call for gpuq job ``job_id`` (an array's id when ``array`` is given).

    ``after`` holds the Slurm ids of the dependencies still to end (those already ended were settled by
    the caller: Slurm reads a dependency on a job it has forgotten as satisfied).
    """
    check(spec, cluster)
    argv = [
        "sbatch",
        "--parsable",
        f"--job-name={spec.display_name}",
        f"--chdir={spec.cwd}",
        "--export=ALL",
        "--open-mode=append",
        f"--comment=gpuq {job_id}",
    ]
    # An array member's output goes to its own gpuq log (the script redirects it); Slurm's own notices
    # about members (cancelled, time limit) go to the array's log, which no member uses.
    argv.append(f"--output={state.log(job_id)}")
    if cluster.partition:
        argv.append(f"--partition={cluster.partition}")
    if cluster.account:
        argv.append(f"--account={cluster.account}")
    if spec.gpus:
        argv.append(f"--gres=gpu:{spec.gpus}")
    if spec.cpus is not None:
        argv.append(f"--cpus-per-task={math.ceil(spec.cpus - 1e-9)}")
    if spec.ram is not None:
        argv.append(f"--mem={-(-spec.ram // (1 << 20))}M")
    limit = spec.time_limit if spec.time_limit is not None else cluster.time
    if limit is not None:
        argv.append(f"--time={slurm_minutes(limit)}")
    if spec.priority < 0:
        argv.append(f"--nice={-spec.priority}")
    if array is not None:
        argv.append(f"--array={array_ranges(array.indices)}" + (f"%{array.throttle}" if array.throttle else ""))
    if after:
        argv += [
            f"--dependency={'afterany' if spec.after_any else 'afterok'}:{':'.join(after)}",
            "--kill-on-invalid-dep=yes",
        ]
    if spec.retries:
        argv.append("--requeue")
    argv += cluster.sbatch_flags  # last, so the cluster's own flags win over gpuq's
    return Batch(tuple(argv), script(spec, cluster, job_id=job_id, state=state, array=array), sbatch_env(spec.env))


def sbatch_env(env: Mapping[str, str]) -> dict[str, str]:
    """The captured environment, less the variables of a Slurm job it may have been captured in
    (submitting from inside an allocation would hand that job's SLURM_JOB_ID, node list... to sbatch)."""
    return {k: v for k, v in env.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}


def slurm_minutes(seconds: float) -> int:
    """Slurm counts time limits in minutes: round up, so a job never gets less than it asked for."""
    return max(1, math.ceil(seconds / 60 - 1e-9))


def array_ranges(indices: Sequence[int]) -> str:
    """Sorted indices as Slurm's --array list: (0..49) -> ``0-49``, (1, 3, 4, 5) -> ``1,3-5``."""
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs(indices))


def runs(indices: Sequence[int]) -> list[tuple[int, int]]:
    """Consecutive stretches of sorted, unique indices, as (first, last) pairs."""
    found: list[tuple[int, int]] = []
    for index in indices:
        if found and index == found[-1][1] + 1:
            found[-1] = (found[-1][0], index)
        else:
            found.append((index, index))
    return found


def command_words(spec: JobSpec) -> list[str]:
    """The job's command as shell words; {index} in an array member's words becomes its Slurm task id."""
    if spec.mode is Mode.TORCHRUN:
        assert spec.python is not None
        head = [
            spec.python,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nnodes",
            "1",
            "--nproc-per-node",
            str(spec.gpus),
        ]
    else:
        head = [spec.python] if spec.python is not None else []
    return [shlex.quote(word) for word in head] + [_with_index(word) for word in spec.command]


def _with_index(word: str) -> str:
    if "{index}" not in word:
        return shlex.quote(word)
    return f'"{TASK}"'.join(shlex.quote(part) if part else "" for part in word.split("{index}")) or '""'


def script(spec: JobSpec, cluster: Cluster, *, job_id: int, state: StateDir, array: ArrayPlan | None) -> str:
    """The batch script: gpuq's environment for the job, the command, the exit file, retries by requeue."""
    q = shlex.quote
    lines = [
        "#!/bin/bash",
        f"# gpuq job {job_id} on cluster {cluster.name}, written by `gpuq submit --on {cluster.name}`",
        f"gpuq_run={q(str(state.run))}",
    ]
    if array is None:
        lines += [f"GPUQ_JOB_ID={job_id}", 'gpuq_self="$SLURM_JOB_ID"']
    else:
        # The last task of a Slurm array has the array's own job id as SLURM_JOB_ID, and `scontrol requeue`
        # of that id requeues the whole array: name the task as ARRAYJOB_TASK instead.
        lines += _member_ids(job_id, array.indices)
        lines += [
            f'exec >>{q(str(state.logs))}/"$GPUQ_JOB_ID.log" 2>&1  # names as in jobs.store.statedir: logs/<id>.log',
            f'export GPUQ_ARRAY_ID={job_id} GPUQ_ARRAY_INDEX="$SLURM_ARRAY_TASK_ID"',
            'gpuq_self="${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"',
        ]
    lines += [
        f"export GPUQ_JOB_ID GPUQ_JOB_NAME={q(spec.display_name)} GPUQ_MODE={spec.mode.value} "
        f"GPUQ_HOME={q(str(state.root))} GPUQ_CLUSTER={q(cluster.name)} GPUQ_MEM_PER_GPU= GPUQ_GPU_UUIDS=",
        "export GPUQ_ATTEMPT=$(( ${SLURM_RESTART_COUNT:-0} + 1 ))",
        "export CUDA_DEVICE_ORDER=PCI_BUS_ID  # Slurm numbers GPUs in PCI bus order, CUDA's default is fastest first",
    ]
    if spec.gpus == 0:
        lines.append("export CUDA_VISIBLE_DEVICES=  # a CPU job sees no GPU, as on the workstation")
    lines += [
        'export GPUQ_GPUS="${CUDA_VISIBLE_DEVICES-}"',
        "gpuq_started=$(date +%s.%N)",
        "gpuq_child=",
        _EXIT_FUNCTIONS,
        f"cd {q(spec.cwd)} || gpuq_fail 'cannot enter the working directory {_json_safe(spec.cwd)} on this node'",
        f"{' '.join(command_words(spec))} &",
        "gpuq_child=$!",
        'wait "$gpuq_child"',
        "gpuq_code=$?",
    ]
    if spec.retries:
        lines += [
            f'if [ "$gpuq_code" -ne 0 ] && [ "${{SLURM_RESTART_COUNT:-0}}" -lt {spec.retries} ]; then',
            f'    echo "gpuq: attempt $GPUQ_ATTEMPT of {spec.retries + 1} ended with exit code $gpuq_code;'
            ' Slurm runs it again"',
            "    trap - TERM  # Slurm stops this script as it requeues the job: this attempt leaves no exit file",
            '    if scontrol requeue "$gpuq_self"; then sleep 600; exit "$gpuq_code"; fi',
            '    echo "gpuq: scontrol requeue $gpuq_self failed: recording this attempt as the last"',
            "    trap gpuq_term TERM",
            "fi",
        ]
    lines += [
        'if [ "$gpuq_code" -gt 128 ] && [ "$gpuq_code" -le 192 ]; then',
        "    gpuq_exit null $((gpuq_code - 128))",
        "else",
        '    gpuq_exit "$gpuq_code" null',
        "fi",
        'exit "$gpuq_code"',
        "",
    ]
    return "\n".join(lines)


# Slurm's exit file, read by jobs.slurm (clusters.read_exit, then commands.follow): the local shims' fields that
# apply (launcher/supervisor/exits.py), plus where and when it ran.
_EXIT_FUNCTIONS = r"""gpuq_exit() {  # EXIT_CODE SIGNAL [REASON [SPAWN_ERROR]]
    local tmp="$gpuq_run/.$GPUQ_JOB_ID.exit.$$.tmp" spawn=null
    local fmt='{"job": %s, "started": true, "exit_code": %s, "signal": %s, "reason": "%s", "spawn_error": %s,'
    fmt+=' "started_at": %s, "ended_at": %s, "gpus": "%s", "node": "%s", "attempt": %s, "slurm_job": "%s"}\n'
    [ -n "${4-}" ] && spawn="\"$4\""
    printf "$fmt" "$GPUQ_JOB_ID" "$1" "$2" "${3-}" "$spawn" "$gpuq_started" "$(date +%s.%N)" "$GPUQ_GPUS" \
        "${SLURMD_NODENAME:-$(hostname)}" "$GPUQ_ATTEMPT" "$gpuq_self" >"$tmp" &&
        mv -f "$tmp" "$gpuq_run/$GPUQ_JOB_ID.exit"
}
gpuq_fail() {
    echo "gpuq: $1" >&2
    gpuq_exit 1 null "" "$1"
    exit 1
}
gpuq_term() {  # scancel or the time limit: pass it on to the job, record how it ended
    trap - TERM
    if [ -n "$gpuq_child" ]; then
        kill -TERM "$gpuq_child" 2>/dev/null
        wait "$gpuq_child"
    fi
    gpuq_exit null 15 signal
    exit 143
}
trap gpuq_term TERM"""


def _member_ids(array_id: int, indices: Sequence[int]) -> list[str]:
    """Shell lines setting GPUQ_JOB_ID from the Slurm task id: member k (in index order) is array_id + 1 + k."""
    lines = ["case 1 in"]
    position = 0
    for first, last in runs(indices):
        base = array_id + 1 + position - first
        lines.append(
            f"    $(( SLURM_ARRAY_TASK_ID >= {first} && SLURM_ARRAY_TASK_ID <= {last} )))"
            f" GPUQ_JOB_ID=$(( SLURM_ARRAY_TASK_ID + {base} )) ;;"
        )
        position += last - first + 1
    lines.append('    *) echo "gpuq: task $SLURM_ARRAY_TASK_ID is not in this array" >&2; exit 1 ;;')
    lines.append("esac")
    return lines


def _json_safe(text: str) -> str:
    """Text for the exit file's reason, written by printf into JSON: no quotes, backslashes or newlines."""
    return "".join(c if c.isprintable() and c not in "\"\\'%" else "?" for c in text)
