"""`ropim probe` as a Ray job (the file's name is the command; `ropim.train.jobs` lists the training jobs).

    ray job submit --working-dir . -- python jobs/probe.py [--preset NAME] [overrides]
"""

import sys
from pathlib import Path

from ropim.cli import main

if __name__ == "__main__":
    main([Path(__file__).stem, *sys.argv[1:]], quiet=True)
