"""The machine: the CPU's kernel set and probe cache, the device, training precision and threads."""
