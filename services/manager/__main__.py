"""``python -m services.manager``: the manager process."""

import sys

from services.manager.main import main

sys.exit(main())
