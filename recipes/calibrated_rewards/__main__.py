"""``python -m recipes.calibrated_rewards [--config configs/rl/calibrated_rewards.yaml]``."""

import sys

from recipes.calibrated_rewards.cli import main

sys.exit(main())
