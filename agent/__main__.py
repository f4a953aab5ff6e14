"""``python -m agent ...``: see agent.main."""

import sys

from agent.main import main

sys.exit(main())
