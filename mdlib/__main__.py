from mdlib.cli import main

raise SystemExit(main())
