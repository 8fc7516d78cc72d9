"""``python -m fedsa_jax.cli``."""

import sys

from fedsa_jax.cli import main

sys.exit(main())
