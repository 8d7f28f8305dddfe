"""`ropim sweep` as a Ray job.

`ray job submit --working-dir . -- python jobs/sweep.py [--preset NAME] [sweep flags] [pretraining overrides]`
"""

import sys

from tune.sweep import main

if __name__ == "__main__":
    main(sys.argv[1:], quiet=True)
