"""``python -m ckpt_core``: the same as the ``ckpt`` command."""

import sys

from ckpt_core.cli import main

sys.exit(main())
