"""``python -m sgl_adaspec.bench``; see `sgl_adaspec.bench.cli`."""

import sys

from sgl_adaspec.bench.cli import main

sys.exit(main())
