"""``python -m recipes.loss_bakeoff --config configs/bakeoff/synthetic.yaml``."""

import sys

from recipes.loss_bakeoff.cli import main

sys.exit(main())
