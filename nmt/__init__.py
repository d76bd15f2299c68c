"""nmt: Chinese→English neural machine translation, end to end."""

__version__ = "0.1.0"

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
