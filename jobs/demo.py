"""`ropim demo` as a Ray job: `ray job submit --working-dir . -- python jobs/demo.py [--preset NAME] [overrides]`."""

import sys

from ropim.cli import main

if __name__ == "__main__":
    main(["demo", *sys.argv[1:]], quiet=True)
