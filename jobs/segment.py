"""`ropim segment` as a Ray job.

    ray job submit --working-dir . -- python jobs/segment.py [--preset NAME] [overrides]
"""

import sys

from ropim.cli import main

if __name__ == "__main__":
    main(["segment", *sys.argv[1:]], quiet=True)
