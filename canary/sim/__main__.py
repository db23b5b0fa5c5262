"""``python -m canary.sim EXPERIMENT ...`` -- same as ``canary simulate``."""

import sys

from canary.sim.cli import main

sys.exit(main())
