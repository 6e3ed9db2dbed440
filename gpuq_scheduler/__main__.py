"""``python -m gpuq_scheduler ...`` is the ``gpuq`` command."""

from gpuq_scheduler.launcher.cli.entry import main

main()
