"""normlab's optimizers and learning-rate schedules (torch.optim's analogue)."""
