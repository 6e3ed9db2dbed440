"""``python -m gpuq_scheduler.launcher.daemon``: run the daemon in the foreground (see ``lifetime``)."""

import sys

from gpuq_scheduler.launcher.daemon.lifetime import main

sys.exit(main())
