"""`python -m testbed.bench allreduce ...`: see testbed/bench/cli.py."""

from testbed.bench.cli import main

raise SystemExit(main())
