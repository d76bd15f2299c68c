"""Training: the loop, one optimizer update, the objective, stopping rules, validation and
checkpoints at each evaluation point, resuming, torch.distributed, and progress logging."""
