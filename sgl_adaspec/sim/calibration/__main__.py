"""`python -m sgl_adaspec.sim.calibration record|fit`: see `cli`."""

import sys

from sgl_adaspec.sim.calibration.cli import main

if __name__ == "__main__":
    sys.exit(main())
