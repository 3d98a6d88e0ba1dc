"""`python -m captioning`: the `captioning` command, where the console script is not on the PATH."""

from captioning.cli import main

raise SystemExit(main())
