"""`python -m launcher`: the offload-launch command line."""

from launcher.cli import main

main()
