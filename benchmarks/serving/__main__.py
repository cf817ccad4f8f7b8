import sys

from benchmarks.serving.cli import main

sys.exit(main())
