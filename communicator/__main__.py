import sys

from communicator.cli import main

sys.exit(main())
