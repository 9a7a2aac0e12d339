"""`python -m localradix.bench ...`: the same as `localradix bench ...`."""

import sys

from localradix.bench import run_bench
from localradix.bench.options import build_parser

if __name__ == "__main__":
    sys.exit(run_bench(build_parser().parse_args()))
