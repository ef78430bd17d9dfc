"""The ONNX tensor names of a model's layers, for exports that ONNX consumers read by
those names (AIMET encodings, the "onnx" format)."""

from __future__ import annotations

import inspect
import io
from collections.abc import Sequence
from typing import Any

import torch

from qparams.torch._naming import parameter_names


def onnx_tensor_names(model: torch.nn.Module, example_inputs: Sequence[Any] | torch.Tensor,
                      **export_kwargs: Any) -> dict[str, str]:
    """{session name relative to the run: ONNX tensor name} for `model` as
    torch.onnx.export writes it, to pass as Client.export(..., tensor_names=...).

    The keys follow name_observers' scheme: "fc1.weight" (a parameter, fused
    modules' parts under the fused module's name) maps to its initializer;
    "fc1.output" and "fc1.input" to the output of the module's last node and the
    data input of its first (torch.onnx scopes node names by module, "/fc1/Gemm");
    a module with no node of its own that passes a model input through (a
    QuantStub) and "x.output" for the forward argument x map to the graph input.
    Pass the model as it was calibrated (fused modules fused: an eager observer of a
    fused LinearReLU watches the ReLU's output) and the export options you deploy
    with (`export_kwargs`, e.g. input_names); the keys of layers it cannot place are
    left out, and their sessions keep their names.

    Raises:
        ImportError: the onnx package is missing (Debian: python3-onnx).
        Whatever torch.onnx.export raises for the model.
    """
    try:
        import onnx
    except ImportError as e:
        raise ImportError("onnx_tensor_names needs the onnx package (Debian: python3-onnx)") from e
    inputs = ((example_inputs,) if isinstance(example_inputs, torch.Tensor)
              else tuple(example_inputs))
    buffer = io.BytesIO()
    with torch.no_grad():
        torch.onnx.export(model, inputs, buffer, **export_kwargs)
    graph = onnx.load_from_string(buffer.getvalue()).graph
    initializers = {tensor.name for tensor in graph.initializer}
    graph_inputs = [value.name for value in graph.input if value.name not in initializers]

    scoped: dict[str, list[Any]] = {}
    for node in graph.node:
        for scope in node.name.split("/")[1:-1]:
            scoped.setdefault(scope, []).append(node)
    names: dict[str, str] = {}
    for path, _ in model.named_modules():
        nodes = scoped.get(path)
        if not path or not nodes:
            continue
        names[f"{path}.output"] = nodes[-1].output[0]
        data = [name for name in nodes[0].input if name and name not in initializers]
        if data:
            names[f"{path}.input"] = data[0]

    # Modules without nodes (QuantStub, Identity) on a model input, found by running it.
    passed: dict[str, int] = {}
    hooks = []
    for path, module in model.named_modules():
        if path and path not in scoped:
            def record(module: Any, args: tuple, output: Any, path: str = path) -> None:
                for i, x in enumerate(inputs):
                    if args and args[0] is x:
                        passed.setdefault(path, i)
            hooks.append(module.register_forward_hook(record))
    try:
        with torch.no_grad():
            model(*inputs)
    finally:
        for hook in hooks:
            hook.remove()
    for path, i in passed.items():
        if i < len(graph_inputs):
            names[f"{path}.output"] = names[f"{path}.input"] = graph_inputs[i]
    arguments = [p.name for p in inspect.signature(model.forward).parameters.values()
                 if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    for argument, graph_input in zip(arguments, graph_inputs):
        names[f"{argument}.output"] = graph_input

    actual = {id(p): name for name, p in model.named_parameters()}
    for key, (_, canonical) in parameter_names(model).items():
        if actual.get(key) in initializers:
            names[canonical] = actual[key]
    return names
