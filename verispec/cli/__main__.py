"""`python -m verispec.cli`, the same as the `verispec` command."""
import sys

from verispec.cli.main import main

sys.exit(main())
