import sys

from experiments.docs_numbers.cli import main

sys.exit(main())
