// The autograd umbrella header: Var, nodes, grad mode, differentiable ops, gradcheck, inspection.
#pragma once

#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "autograd/gradcheck.h"
#include "autograd/graph.h"
#include "autograd/node.h"
#include "autograd/var.h"
