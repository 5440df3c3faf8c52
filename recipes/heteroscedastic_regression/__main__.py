"""``python -m recipes.heteroscedastic_regression --config
configs/regression/heteroscedastic.yaml``."""

import sys

from recipes.heteroscedastic_regression.cli import main

sys.exit(main())
