from marble.report.cli import main

raise SystemExit(main())
