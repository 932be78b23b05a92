"""``python -m seeder.training``: the Ray-free training driver (``seeder.training.loop.main``)."""

import sys

from seeder.training.loop import main

sys.exit(main())
