import sys

from testbed.nscluster.cli import main

sys.exit(main())
