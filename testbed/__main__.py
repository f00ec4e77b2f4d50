from testbed.run import main

raise SystemExit(main())
