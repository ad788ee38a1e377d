"""``python -m probekit`` runs the command line."""

import sys

from probekit.cli import main

sys.exit(main())
