# The package documents itself: type stubs (.pyi) for the extension and each of its submodules that
# parse and name every public binding, and a docstring on every public function and class.
import ast
import importlib
import inspect
import pathlib

import pytest

import normlab

EXTENSION_MODULES = ["normlab._normlab", "normlab._normlab.nn", "normlab._normlab.optim",
                     "normlab._normlab.jobs", "normlab._normlab.kernels"]
PYTHON_MODULES = ["normlab", "normlab.autograd", "normlab.autograd.functional", "normlab.nn",
                  "normlab.nn.functional", "normlab.nn.utils", "normlab.optim", "normlab.optim.lr_scheduler"]


def stub_path(module_name):
    folder = pathlib.Path(normlab.__file__).parent / "_normlab"
    leaf = module_name.split(".")[2:]
    return folder / (f"{leaf[0]}.pyi" if leaf else "__init__.pyi")


def defined_names(body):
    """Names a stub's statements define: functions, classes, assignments, imports."""
    names = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.ImportFrom):
            names.update(alias.asname or alias.name for alias in node.names)
    return names


def parsed_stub(module_name):
    path = stub_path(module_name)
    assert path.is_file(), f"no type stub {path}"
    return ast.parse(path.read_text(), filename=str(path))


@pytest.mark.parametrize("module_name", EXTENSION_MODULES)
def test_each_extension_module_has_a_stub_naming_all_its_bindings(module_name):
    module = importlib.import_module(module_name)
    names = defined_names(parsed_stub(module_name).body)
    public = {n for n in dir(module) if not n.startswith("_")}
    assert public, module_name
    assert public - names == set()


def test_every_submodule_of_the_extension_is_stubbed():
    # python/CMakeLists.txt lists the submodules whose stubs pip installs; a new one must join it.
    submodules = {f"normlab._normlab.{n}" for n, v in vars(normlab._normlab).items() if inspect.ismodule(v)}
    assert submodules == set(EXTENSION_MODULES[1:])


def test_the_tensor_stub_has_every_method_with_its_signature():
    tree = parsed_stub("normlab._normlab")
    tensor = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Tensor")
    names = defined_names(tensor.body)
    methods = {n for n in dir(normlab.Tensor) if not n.startswith("_")}
    methods |= {"__getitem__", "__setitem__", "__repr__", "__float__", "__iter__", "__matmul__"}
    assert methods - names == set()
    # The methods written in Python carry their signatures into the stub.
    flatten = next(n for n in tensor.body if isinstance(n, ast.FunctionDef) and n.name == "flatten")
    assert [a.arg for a in flatten.args.args] == ["self", "start_dim", "end_dim"]
    assert ast.unparse(flatten.returns) == "Tensor"


def public_objects():
    for module_name in EXTENSION_MODULES + PYTHON_MODULES:
        module = importlib.import_module(module_name)
        for name in dir(module):
            value = getattr(module, name)
            if name.startswith("_") or inspect.ismodule(value) or not callable(value):
                continue
            if isinstance(value, normlab.dtype):
                continue
            yield f"{module_name}.{name}", value
            if inspect.isclass(value):
                for attr, member in vars(value).items():
                    if not attr.startswith("_") and callable(member):
                        yield f"{module_name}.{name}.{attr}", member


def test_every_public_function_and_class_has_a_docstring():
    missing = sorted({name for name, value in public_objects()
                      if not (inspect.getdoc(value) or "").strip()})
    assert missing == []


def test_help_shows_signatures_and_docs():
    assert "start_dim" in inspect.signature(normlab.Tensor.flatten).parameters
    assert "float" in (normlab.Tensor.__float__.__doc__ or "")
    doc = normlab._normlab.kernels.norm_forward.__doc__
    assert "norm_forward(x:" in doc and "LayerNorm" in doc
