"""`python -m nmt ...` (and `torchrun -m nmt train ...`)."""

from nmt.cli import main

if __name__ == "__main__":
    main()
