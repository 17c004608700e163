"""Learning-rate schedules (torch.optim.lr_scheduler's shape) on optim/schedule.h: a constant rate and
linear warmup then cosine decay, nanoGPT's and llm.c's schedule. A scheduler sets its optimizer's lr
to the schedule's value for the update about to be applied: get_lr(0) when it is made, and
get_lr(n) after n calls of step(), so the loop is PyTorch's (optimizer.step(); scheduler.step()).

    warmup (step < warmup_steps):   lr = base_lr * (step + 1) / warmup_steps
    constant, after the warmup:     lr = base_lr
    cosine, warmup <= step < total: lr = min_lr + 0.5 * (1 + cos(pi * r)) * (base_lr - min_lr),
                                    r = (step - warmup_steps) / (total_steps - warmup_steps)
    cosine, step >= total_steps:    lr = min_lr
"""
from .. import _normlab as C
from .._normlab import Error

LrSchedule = C.optim.LrSchedule  # the C++ schedule: lr_at(step)

__all__ = ["LRScheduler", "Constant", "WarmupCosine", "LrSchedule", "constant", "warmup_cosine"]


def constant(lr, warmup_steps=0):
    """The C++ constant schedule (LrSchedule): lr, after a linear warmup of warmup_steps updates."""
    return LrSchedule.constant(float(lr), int(warmup_steps))


def warmup_cosine(base_lr, warmup_steps, total_steps, min_lr=0.0):
    """The C++ warmup + cosine schedule (LrSchedule): base_lr after the warmup, down to min_lr at total_steps."""
    return LrSchedule.warmup_cosine(float(base_lr), int(warmup_steps), int(total_steps), float(min_lr))


class LRScheduler:
    """Sets an optimizer's lr from a schedule (an LrSchedule): at construction the lr of update 0, after
    each step() the next update's. last_step counts the step() calls."""

    def __init__(self, optimizer, schedule):
        if not hasattr(optimizer, "param_groups"):
            raise Error(f"{type(self).__name__}: expected a normlab.optim optimizer, found {type(optimizer).__name__}")
        self.optimizer = optimizer
        self.schedule = schedule
        self.last_step = 0
        self.optimizer.param_groups[0].setdefault("initial_lr", schedule.base_lr)
        self._apply()

    def _apply(self):
        self.optimizer.param_groups[0]["lr"] = self.get_lr()

    def get_lr(self, step=None):
        """The schedule's lr for update `step` (None: the update about to be applied, last_step)."""
        return self.schedule.lr_at(self.last_step if step is None else int(step))

    def get_last_lr(self):
        """[the optimizer's lr], as PyTorch returns one per parameter group."""
        return [self.optimizer.param_groups[0]["lr"]]

    def step(self):
        """Moves to the next update and sets the optimizer's lr to its value."""
        self.last_step += 1
        self._apply()

    def state_dict(self):
        """{"last_step": n}: what a resume needs (the schedule comes from the constructor)."""
        return {"last_step": self.last_step}

    def load_state_dict(self, state_dict):
        """Restores last_step and sets the optimizer's lr to that update's."""
        self.last_step = int(state_dict["last_step"])
        self._apply()

    def __repr__(self):
        return f"{type(self).__name__}({self.schedule!r}, last_step={self.last_step})"


class Constant(LRScheduler):
    """A constant lr (None: the optimizer's), after a linear warmup over warmup_steps updates."""

    def __init__(self, optimizer, lr=None, warmup_steps=0):
        super().__init__(optimizer, constant(optimizer.lr if lr is None else lr, warmup_steps))


class WarmupCosine(LRScheduler):
    """Linear warmup over warmup_steps updates to base_lr (None: the optimizer's lr), then cosine decay to
    min_lr at total_steps, min_lr after (nanoGPT's get_lr after its warmup; llm.c's warmup)."""

    def __init__(self, optimizer, warmup_steps, total_steps, min_lr=0.0, base_lr=None):
        super().__init__(optimizer, warmup_cosine(optimizer.lr if base_lr is None else base_lr, warmup_steps,
                                                  total_steps, min_lr))
