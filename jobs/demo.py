"""`ropim demo` as a Ray job (the file's name is the command; a flow of ``ropim.flows``, not a training job).

    ray job submit --working-dir . -- python jobs/demo.py [--preset NAME] [flags]
"""

import sys
from pathlib import Path

from ropim.cli import main

if __name__ == "__main__":
    main([Path(__file__).stem, *sys.argv[1:]], quiet=True)
