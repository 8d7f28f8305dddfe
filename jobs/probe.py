"""`ray job submit --working-dir . -- python jobs/probe.py [--preset NAME] [overrides]`: `ropim probe` as a Ray job."""

import sys

from ropim.cli import main

if __name__ == "__main__":
    main(["probe", *sys.argv[1:]], quiet=True)
