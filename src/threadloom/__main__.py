from threadloom.cli import main

raise SystemExit(main())
