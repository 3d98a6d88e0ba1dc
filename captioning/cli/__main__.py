"""`python -m captioning.cli`: the `captioning` command."""

from captioning.cli import main

raise SystemExit(main())
