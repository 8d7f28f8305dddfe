"""`ray job submit --working-dir . -- python jobs/transfer.py --encoders A,B --data D1,D2 [overrides]`."""

import sys

from ropim.cli import main

if __name__ == "__main__":
    main(["transfer", *sys.argv[1:]], quiet=True)
