"""normlab's layers with PyTorch's names (torch.nn's analogue)."""
