from threadloom.agent.cli import main

raise SystemExit(main())
