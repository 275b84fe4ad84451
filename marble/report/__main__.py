from marble.report import main

raise SystemExit(main())
