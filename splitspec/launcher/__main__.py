"""`python -m splitspec.launcher serve MODEL ...` (what `make run` runs): the `splitspec`
command."""

from splitspec.launcher.cli import main

if __name__ == "__main__":
    main()
