"""HOW queued jobs get GPUs and become processes (installed as ``gpuq_scheduler.launcher``).

Rooms: ``policy/`` (pure decisions), ``gpus/`` (what the GPUs hold), ``daemon/`` (the daemon's lifetime,
its tick and its steps), ``views/`` (what readers print), ``cli/`` (the ``gpuq`` command).
"""
