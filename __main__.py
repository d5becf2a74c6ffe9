from deltacheck.harness.cli import main

raise SystemExit(main())
