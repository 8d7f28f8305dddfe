"""`ropim graft` as a Ray job.

    ray job submit --working-dir . -- python jobs/graft.py [--preset NAME] [overrides]
"""

import sys

from ropim.cli import main

if __name__ == "__main__":
    main(["graft", *sys.argv[1:]], quiet=True)
