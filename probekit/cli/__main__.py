"""``python -m probekit.cli`` runs the command line (as ``python -m probekit`` does)."""

import sys

from probekit.cli import main

sys.exit(main())
