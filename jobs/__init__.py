"""WHAT a job is and WHERE it is written (installed as ``gpuq_scheduler.jobs``).

Never imports ``launcher``, NVML, psutil or click: it is the light path ``gpuq submit`` takes.
Rooms: the model and its rules at this level, ``store/`` (the state directory), ``slurm/`` (the cluster
backend). The Python API is ``jobs.api``, re-exported by ``gpuq_scheduler``.
"""
