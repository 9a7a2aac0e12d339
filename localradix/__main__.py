"""`python -m localradix` = the `localradix` command."""

import sys

from localradix.cli import main

if __name__ == "__main__":
    sys.exit(main())
