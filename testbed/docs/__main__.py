import sys

from testbed.docs.generate import main

sys.exit(main())
