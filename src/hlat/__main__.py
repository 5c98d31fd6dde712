import sys

from hlat.cli import main

sys.exit(main())
