"""``python -m kernelgate``: the command-line interface."""

from kernelgate.cli import main

raise SystemExit(main())
