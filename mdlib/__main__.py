from mdlib.book.cli import main

raise SystemExit(main())
