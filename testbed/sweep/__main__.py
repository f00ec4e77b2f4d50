import sys

from testbed.sweep.cli import main

sys.exit(main())
