"""name_observers: a prepared model's RemoteObservers named after what they watch."""

from __future__ import annotations

import torch

from qparams.torch import _naming
from qparams.torch._observer import RemoteObserver

__all__ = ["name_observers"]


def name_observers(model: torch.nn.Module, run: str | None = None) -> dict[str, RemoteObserver]:
    """Names the session of every RemoteObserver in a prepared `model` after what it
    watches (see qparams/torch/_naming.py): "exp1/fc1.output" (eager) or
    "exp1/fc2.input" (FX) for activations; and registers the model's parameters so
    that the weight observers torch.ao's convert creates are named after them,
    "exp1/fc1.weight".

    Call it right after torch.ao's `prepare` (or `prepare_fx`), before calibrating;
    data-parallel ranks that prepare the same model get the same names.

    Args:
        model: the prepared model (an nn.Module, or the GraphModule of prepare_fx).
        run: the prefix; default each observer's own `run`.

    Returns:
        {session name: observer}, in the model's module order.

    Raises:
        RuntimeError: an observer already created or used its session under another
            name, or two observers would get one name (nothing is renamed then).
    """
    observers = {path: module for path, module in model.named_modules()
                 if isinstance(module, RemoteObserver)}
    if isinstance(model, torch.fx.GraphModule):
        by_id = _naming.fx_names(model, RemoteObserver)
        relative = {path: by_id.get(id(module), path) for path, module in observers.items()}
    else:
        relative = {path: _naming.eager_name(path) for path in observers}
    names: dict[str, RemoteObserver] = {}
    for path, module in observers.items():
        new = f"{run if run is not None else module.run}/{relative[path]}"
        if module._used_name is not None and module._used_name != new:
            raise RuntimeError(
                f"observer {path or '(the model)'} already uses its session "
                f"{module._used_name!r}; name_observers must run before it observes "
                f"(right after prepare), not after (it would become {new!r})")
        if new in names and names[new] is not module:
            raise RuntimeError(f"observers {path} and another would both be named {new!r}")
        names[new] = module
    for new, module in names.items():
        module._name = new
        module._auto_name = False
    _naming.register_parameters(model, run)
    _name_weight_observers(model, run)
    return names


def _name_weight_observers(model: torch.nn.Module, run: str | None) -> None:
    """Gives each module's qconfig a weight factory that names its observer after the
    module's weight: eager convert deep-copies the model before it calls
    `module.qconfig.weight()`, so the parameter registry cannot recognise the copies'
    parameters, but the qconfig travels with them."""
    modules = dict(model.named_modules())
    for path, module in modules.items():
        qconfig = getattr(module, "qconfig", None)
        factory = getattr(qconfig, "weight", None)
        if not path or factory is None or not _naming.makes(factory, RemoteObserver):
            continue
        prefix = run if run is not None else factory().run
        layer = _naming.layer_path(path, modules)
        module.qconfig = qconfig._replace(weight=factory.with_args(name=f"{prefix}/{layer}.weight"))
