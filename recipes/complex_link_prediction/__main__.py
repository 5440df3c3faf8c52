"""``python -m recipes.complex_link_prediction --config configs/complex/family.yaml``."""

import sys

from recipes.complex_link_prediction.cli import main

sys.exit(main())
