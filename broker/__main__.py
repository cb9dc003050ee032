from broker.process.cli import main

raise SystemExit(main())
