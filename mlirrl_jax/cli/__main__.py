"""`python -m mlirrl_jax.cli COMMAND`, as `mlirrl-jax COMMAND`."""

import sys

from mlirrl_jax.cli import main

sys.exit(main())
