"""`python -m sgl_adaspec --help`: the plugin's flags. They are SGLang launcher flags
(`python -m sglang.launch_server ... --spec-policy adaserve`); `sglang serve --help` prints its
help before plugins load, so it does not list them."""

from __future__ import annotations

import argparse
import sys

from sgl_adaspec import __version__
from sgl_adaspec.adapters import cli


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sglang.launch_server",
        description=(
            f"sgl_adaspec {__version__}: the flags it adds to SGLang's launcher "
            "(python -m sglang.launch_server or sglang serve)."
        ),
    )
    cli.add_cli_args(None, parser)
    parser.parse_args(["--help"] if argv is None else argv)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or None))
