"""``python -m seeder.cli``: the ``seeder`` command."""

import sys

from seeder.cli.main import main

sys.exit(main())
