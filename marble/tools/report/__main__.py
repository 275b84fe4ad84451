from marble.tools.report import main

raise SystemExit(main())
