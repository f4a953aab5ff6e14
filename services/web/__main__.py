import sys

from services.web.main import main

sys.exit(main())
