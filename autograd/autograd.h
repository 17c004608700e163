// The autograd umbrella header: Var, nodes, grad mode, differentiable ops, fused nodes with a composed
// twin, gradcheck, Hessian-vector products, inspection.
#pragma once

#include "autograd/functional.h"
#include "autograd/functions.h"
#include "autograd/fused_node.h"
#include "autograd/grad_mode.h"
#include "autograd/gradcheck.h"
#include "autograd/graph.h"
#include "autograd/node.h"
#include "autograd/var.h"
