from investigations.cli import main

raise SystemExit(main())
