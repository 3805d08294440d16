from ortgate.cli import main

raise SystemExit(main())
