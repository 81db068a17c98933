import sys

from fedtsp.cli import main

sys.exit(main())
