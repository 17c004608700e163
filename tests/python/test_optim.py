"""normlab.optim: SGD, Adam and AdamW (the C++ optimizers) against torch.optim on the same problem in
float64, the learning rate set through param_groups and opt.lr, exact resumes through state_dict (and
from PyTorch's), the schedules of optim/schedule.h against their formula and nanoGPT's get_lr, and
the errors for bad options. Tests that compare with PyTorch take the `torch` fixture (conftest.py)."""
import math

import numpy as np
import pytest

import normlab as nl
from normlab import nn, optim
from normlab.optim import lr_scheduler

TOL = 1e-12
STEPS = 5


def _problem(seed=0):
    rng = np.random.default_rng(seed)
    return {"W": rng.standard_normal((4, 3)), "b": rng.standard_normal(4), "u": rng.standard_normal(3),
            "x": rng.standard_normal((8, 3)), "y": rng.standard_normal((8, 4))}


def _loss(W, b, x, y):
    """A least-squares fit plus a cubic term, so the gradients change from step to step. u gets no grad."""
    r = x @ W.t() + b - y
    return (r * r).mean() + (W * W * W).sum() * 0.01


def _params(lib, problem):
    return [lib.tensor(problem[k], requires_grad=True) for k in ("W", "b", "u")]


def _train(lib, make, steps=STEPS, problem=None, params=None, lrs=None):
    """`steps` updates of W and b (u never has a grad, so an optimizer must skip it), in normlab (lib=nl)
    or PyTorch; lrs: a learning rate to set through param_groups before each step."""
    problem = problem or _problem()
    params = params or _params(lib, problem)
    opt = make(params) if callable(make) else make
    x, y = lib.tensor(problem["x"]), lib.tensor(problem["y"])
    for step in range(steps):
        if lrs is not None:
            opt.param_groups[0]["lr"] = lrs[step]
        opt.zero_grad()
        _loss(params[0], params[1], x, y).backward()
        opt.step()
    return params, opt


def _np(t):
    return t.detach().numpy()


CASES = [
    ("SGD", {"lr": 0.1}),
    ("SGD", {"lr": 0.1, "momentum": 0.9}),
    ("SGD", {"lr": 0.05, "momentum": 0.9, "dampening": 0.5, "weight_decay": 0.01}),
    ("SGD", {"lr": 0.05, "momentum": 0.8, "weight_decay": 0.1, "nesterov": True}),
    ("Adam", {}),
    ("Adam", {"lr": 0.05, "betas": (0.8, 0.99), "eps": 1e-6}),
    ("Adam", {"lr": 0.05, "weight_decay": 0.1}),
    ("Adam", {"lr": 0.05, "weight_decay": 0.05, "amsgrad": True}),
    ("AdamW", {"lr": 0.05}),
    ("AdamW", {"lr": 0.05, "betas": (0.5, 0.9), "weight_decay": 0.2, "amsgrad": True}),
]


@pytest.mark.parametrize("name,options", CASES, ids=[f"{n}-{'-'.join(o) or 'defaults'}" for n, o in CASES])
def test_optimizers_match_torch_after_five_steps(torch, name, options):
    ours, _ = _train(nl, lambda ps: getattr(optim, name)(ps, **options))
    theirs, _ = _train(torch, lambda ps: getattr(torch.optim, name)(ps, **options))
    for p, tp in zip(ours, theirs):
        np.testing.assert_allclose(_np(p), _np(tp), rtol=TOL, atol=TOL)
    np.testing.assert_array_equal(_np(ours[2]), _problem()["u"])  # no grad: never updated, as in PyTorch


def _signature_defaults(cls):
    import inspect
    return {k: p.default for k, p in inspect.signature(cls).parameters.items() if k != "params"}


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW"])
def test_defaults_are_the_cpp_options(name):
    cpp = {"SGD": nl._normlab.optim.SGDOptions(), "Adam": nl._normlab.optim.AdamOptions(),
           "AdamW": nl._normlab.optim.adamw_defaults()}[name]
    ours = _signature_defaults(getattr(optim, name))
    assert ours and all(value == ((cpp.beta1, cpp.beta2) if key == "betas" else getattr(cpp, key))
                        for key, value in ours.items()), ours
    assert ours["weight_decay"] == (0.01 if name == "AdamW" else 0.0)


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW"])
def test_defaults_are_torchs(torch, name):
    theirs = _signature_defaults(getattr(torch.optim, name))
    for key, value in _signature_defaults(getattr(optim, name)).items():
        their = tuple(theirs[key]) if key == "betas" else float(theirs[key])
        assert their == value, (key, their, value)


def test_learning_rate_set_through_param_groups_and_lr_like_torch(torch):
    lrs = [0.1, 0.05, 0.2, 0.0, 0.01]
    ours, opt = _train(nl, lambda ps: optim.Adam(ps, lr=1.0, amsgrad=True), lrs=lrs)
    theirs, _ = _train(torch, lambda ps: torch.optim.Adam(ps, lr=1.0, amsgrad=True), lrs=lrs)
    for p, tp in zip(ours, theirs):
        np.testing.assert_allclose(_np(p), _np(tp), rtol=TOL, atol=TOL)
    assert opt.lr == opt.param_groups[0]["lr"] == 0.01
    opt.lr = 0.3
    assert opt.param_groups[0]["lr"] == 0.3 and opt._cxx.lr == 0.3


def test_a_schedule_drives_the_optimizer_like_setting_torchs_lr(torch):
    schedule = lr_scheduler.warmup_cosine(0.1, 2, 4, 0.01)
    ours_params = _params(nl, _problem())
    opt = optim.SGD(ours_params, lr=0.1, momentum=0.9)
    scheduler = lr_scheduler.WarmupCosine(opt, warmup_steps=2, total_steps=4, min_lr=0.01)
    x, y = nl.tensor(_problem()["x"]), nl.tensor(_problem()["y"])
    seen = []
    for _ in range(STEPS):
        seen.append(opt.lr)
        opt.zero_grad()
        _loss(ours_params[0], ours_params[1], x, y).backward()
        opt.step()
        scheduler.step()
    assert seen == [schedule.lr_at(s) for s in range(STEPS)]
    theirs, _ = _train(torch, lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9), lrs=seen)
    for p, tp in zip(ours_params, theirs):
        np.testing.assert_allclose(_np(p), _np(tp), rtol=TOL, atol=TOL)


@pytest.mark.parametrize("name,options", [("SGD", {"lr": 0.1, "momentum": 0.9, "nesterov": True}),
                                          ("Adam", {"lr": 0.05, "amsgrad": True}),
                                          ("AdamW", {"lr": 0.05, "weight_decay": 0.1})])
def test_state_dict_resumes_bit_for_bit(name, options):
    make = lambda ps: getattr(optim, name)(ps, **options)  # noqa: E731
    straight, _ = _train(nl, make)
    first, opt = _train(nl, make, steps=3)
    state = opt.state_dict()
    assert state["type"] == name and state["step"] == 3 and set(state["state"]) == {"0", "1"}  # u: no state
    assert state["param_groups"][0]["params"] == ["0", "1", "2"] and state["param_groups"][0]["lr"] == options["lr"]
    resumed = [p.detach().clone().requires_grad_() for p in first]
    opt2 = make(resumed)
    opt2.load_state_dict(state)
    assert opt2._cxx.step_count == 3
    _train(nl, opt2, steps=2, params=resumed)
    for a, b in zip(straight, resumed):
        np.testing.assert_array_equal(_np(a), _np(b))


def test_loads_torchs_state_dict(torch):
    torch_params, torch_opt = _train(torch, lambda ps: torch.optim.Adam(ps, lr=0.05, amsgrad=True), steps=3)
    ours = [nl.from_dlpack(p.detach().clone()).requires_grad_() for p in torch_params]
    opt = optim.Adam(ours, lr=0.05, amsgrad=True)
    opt.load_state_dict(torch_opt.state_dict())  # integer keys, float step tensors, PyTorch's extra group keys
    _train(torch, torch_opt, steps=2, params=torch_params)
    _train(nl, opt, steps=2, params=ours)
    for p, tp in zip(ours, torch_params):
        np.testing.assert_allclose(_np(p), _np(tp), rtol=TOL, atol=TOL)


def test_named_parameters_key_the_state_and_groups_hold_the_callers_tensors():
    model = nn.Sequential(nn.Linear(3, 4), nn.RMSNorm(4))
    opt = optim.AdamW(model.named_parameters(), lr=0.01)
    assert opt.param_groups[0]["params"][0] is model[0].weight
    assert dict(opt.param_groups[0]) == {"params": list(model.parameters()), "lr": 0.01, "betas": (0.9, 0.999),
                                         "eps": 1e-8, "weight_decay": 0.01, "amsgrad": False}
    model(nl.randn(2, 3)).sum().backward()
    loss = opt.step(lambda: 1.5)
    assert loss == 1.5
    state = opt.state_dict()
    assert list(state["state"]) == ["0.weight", "0.bias", "1.weight"]
    assert sorted(state["state"]["0.weight"]) == ["exp_avg", "exp_avg_sq", "step"]
    opt.zero_grad(set_to_none=False)
    assert model[0].weight.grad.tolist() == [[0.0] * 3] * 4
    opt.zero_grad()
    assert model[0].weight.grad is None
    opt.param_groups[0]["initial_lr"] = 0.01  # a key of one's own, as schedulers add
    opt.param_groups[0]["eps"] = 1e-8         # the same value: allowed
    # A tensor given twice (tied weights) is updated once, under its first name, as torch dedups.
    w = nl.ones(2, requires_grad=True)
    assert len(optim.SGD([w, w], lr=0.1).param_groups[0]["params"]) == 1


# ---- schedules ----

def _formula(step, base_lr, warmup, total, min_lr):
    """optim/schedule.h's formula, written out (warmup, then cosine to min_lr at total)."""
    if step < warmup:
        return base_lr * (step + 1) / warmup
    if step >= total:
        return min_lr
    ratio = (step - warmup) / (total - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (base_lr - min_lr)


def _nanogpt_get_lr(it, learning_rate, warmup_iters, lr_decay_iters, min_lr):
    """nanoGPT's train.py get_lr (karpathy/nanoGPT)."""
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return min_lr + coeff * (learning_rate - min_lr)


def test_schedules_equal_the_formula_and_nanogpts_get_lr():
    base, warmup, total, min_lr = 6e-4, 100, 5000, 6e-5
    schedule = lr_scheduler.warmup_cosine(base, warmup, total, min_lr)
    assert schedule.kind == "cosine" and repr(schedule).startswith("cosine(base_lr=")
    for step in (0, 1, 50, 98, 99, 100, 101, 1234, 2550, 4999, 5000, 5001, 10 ** 6):
        assert schedule.lr_at(step) == pytest.approx(_formula(step, base, warmup, total, min_lr), rel=1e-15, abs=0)
    assert schedule.lr_at(warmup - 1) == base and schedule.lr_at(total) == min_lr
    # nanoGPT's decay is the same; its warmup is lr * (it + 1) / (warmup + 1), which reaches base_lr one
    # step later than normlab's llm.c-style lr * (step + 1) / warmup.
    for step in list(range(warmup, warmup + 5)) + [777, 2550, 4998, 4999, 5000, 5001, 9000]:
        assert schedule.lr_at(step) == pytest.approx(_nanogpt_get_lr(step, base, warmup, total, min_lr), rel=1e-14)
    assert schedule.lr_at(0) == base / warmup != _nanogpt_get_lr(0, base, warmup, total, min_lr)
    constant = lr_scheduler.constant(0.1, warmup_steps=4)
    assert [constant.lr_at(s) for s in range(6)] == [0.1 * (s + 1) / 4 for s in range(4)] + [0.1, 0.1]
    assert lr_scheduler.constant(0.1).lr_at(0) == 0.1


def test_schedulers_set_the_optimizers_lr_and_resume():
    opt = optim.SGD([nl.ones(2, requires_grad=True)], lr=0.5)
    scheduler = lr_scheduler.WarmupCosine(opt, warmup_steps=3, total_steps=10, min_lr=0.05)
    assert opt.lr == scheduler.get_lr(0) == 0.5 / 3 and opt.param_groups[0]["initial_lr"] == 0.5
    for n in range(1, 12):
        scheduler.step()
        assert scheduler.last_step == n and opt.lr == scheduler.get_lr() == _formula(n, 0.5, 3, 10, 0.05)
        assert scheduler.get_last_lr() == [opt.lr]
    state = scheduler.state_dict()
    other = lr_scheduler.WarmupCosine(optim.SGD([nl.ones(2, requires_grad=True)], lr=0.5), 3, 10, 0.05)
    other.load_state_dict(state)
    assert other.last_step == 11 and other.optimizer.lr == opt.lr == 0.05
    constant = lr_scheduler.Constant(optim.Adam([nl.ones(1, requires_grad=True)], lr=0.2), warmup_steps=2)
    assert constant.optimizer.lr == 0.1
    constant.step()
    assert constant.optimizer.lr == 0.2 and constant.get_lr(100) == 0.2


# ---- errors ----

def _ps():
    return [nl.ones(3, requires_grad=True)]


@pytest.mark.parametrize("make,message", [
    (lambda: optim.SGD(_ps(), lr=-1.0), "SGD: invalid learning rate -1 (expected >= 0)"),
    (lambda: optim.SGD(_ps(), lr=0.1, momentum=-0.5), "SGD: invalid momentum -0.5 (expected >= 0)"),
    (lambda: optim.SGD(_ps(), lr=0.1, weight_decay=-1), "SGD: invalid weight_decay -1 (expected >= 0)"),
    (lambda: optim.SGD(_ps(), lr=0.1, nesterov=True),
     "SGD: nesterov momentum requires a momentum and zero dampening, found momentum 0 and dampening 0"),
    (lambda: optim.Adam(_ps(), lr=-0.1), "Adam: invalid learning rate -0.1 (expected >= 0)"),
    (lambda: optim.Adam(_ps(), betas=(1.0, 0.9)), "Adam: invalid beta1 1 (expected in [0, 1))"),
    (lambda: optim.Adam(_ps(), betas=(0.9, -0.1)), "Adam: invalid beta2 -0.1 (expected in [0, 1))"),
    (lambda: optim.Adam(_ps(), eps=-1e-8), "Adam: invalid eps -1e-08 (expected >= 0)"),
    (lambda: optim.AdamW(_ps(), weight_decay=-0.01), "AdamW: invalid weight_decay -0.01 (expected >= 0)"),
    (lambda: optim.Adam(_ps(), betas=0.9), "Adam: betas must be a pair (beta1, beta2), found 0.9"),
    (lambda: optim.SGD([], lr=0.1), "SGD: got an empty parameter list"),
    (lambda: optim.SGD([{"params": _ps()}, {"params": _ps()}], lr=0.1),
     "SGD: normlab's optimizers hold one parameter group, found 2"),
    (lambda: optim.SGD([{"params": _ps(), "betas": (0.9, 0.9)}], lr=0.1),
     "SGD: unknown option(s) betas in the parameter group"),
    (lambda: optim.SGD([nl.arange(3)], lr=0.1), "Optimizer: parameter '0' must be floating, found i64"),
    (lambda: optim.SGD([nl.ones(2, requires_grad=True) * 2], lr=0.1),
     "Optimizer: parameter '0' is not a leaf (it has a grad_fn)"),
    (lambda: lr_scheduler.WarmupCosine(optim.SGD(_ps(), lr=0.1), 10, 5),
     "LrSchedule: cosine total_steps must be > warmup_steps, found total 5 and warmup 10"),
    (lambda: lr_scheduler.constant(-1.0), "LrSchedule: base_lr must be >= 0, found -1"),
])
def test_bad_options_are_errors_with_the_message(make, message):
    with pytest.raises(nl.Error) as raised:
        make()
    assert message in str(raised.value)


def test_bad_changes_and_states_are_errors():
    opt = optim.SGD(_ps(), lr=0.1, momentum=0.9)
    with pytest.raises(nl.Error, match="SGD: invalid learning rate -1"):
        opt.lr = -1
    with pytest.raises(nl.Error, match="SGD: only 'lr' can change once the optimizer is made"):
        opt.param_groups[0]["momentum"] = 0.5
    adam = optim.Adam(_ps())
    with pytest.raises(nl.Error, match="the state is from a SGD optimizer, expected Adam"):
        adam.load_state_dict(opt.state_dict())
    untyped = {k: v for k, v in opt.state_dict().items() if k != "type"}  # as a PyTorch SGD's state
    with pytest.raises(nl.Error, match="Adam.load_state_dict: the parameter group has no 'betas'"):
        adam.load_state_dict(untyped)
    opt.param_groups[0]["params"][0].grad = nl.ones(3)
    opt.step()
    state = opt.state_dict()
    state["state"]["7"] = state["state"].pop("0")
    with pytest.raises(nl.Error, match="unexpected key '7.momentum_buffer': no parameter named '7'"):
        opt.load_state_dict(state)
    with pytest.raises(TypeError, match="iterable of Tensors"):
        optim.SGD(nl.ones(2, requires_grad=True), lr=0.1)
