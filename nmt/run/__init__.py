"""The run directory (runs/<name>/): its folders and `runs/latest`, which checkpoint exists and
which one loads, the weights saved in it, and its training log."""
