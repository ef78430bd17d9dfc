"""PyTorch observers backed by qparams sessions, for torch.ao.quantization.

A RemoteObserver is a torch.ao observer (an nn.Module with `forward` and
`calculate_qparams`) whose statistics live in a named session on a qparams server:
`forward` reduces each tensor where it lives and queues it for the client's
background thread (the training step does not wait on the network);
`calculate_qparams` flushes and reads the session. It takes MinMaxObserver's and
PerChannelMinMaxObserver's arguments with their meaning.

Eager mode:

    import torch
    from torch.ao.quantization import QConfig, prepare, convert
    from qparams.torch import RemoteObserver, name_observers

    qconfig = QConfig(
        activation=RemoteObserver.with_args(run="exp1", dtype=torch.quint8),
        weight=RemoteObserver.with_args(run="exp1", dtype=torch.qint8,
                                        qscheme=torch.per_channel_symmetric))
    model.qconfig = qconfig
    prepared = prepare(model)
    name_observers(prepared, "exp1")    # sessions "exp1/fc1.output", "exp1/fc1.weight"...
    with torch.no_grad():
        for batch in calibration_data:
            prepared(batch)
    quantized = convert(prepared)       # flushes, then reads every session

FX mode takes the same QConfig through a QConfigMapping: prepare_fx, name_observers,
calibrate, convert_fx ("exp1/fc1.input", "exp1/fc1.weight"...). PT2E
(torch.ao.quantization.quantize_pt2e) is not in torch 1.13, which this package is
tested with.

Histogram calibration: RemoteObserver(calculator="percentile" | "entropy" | "mse",
histogram={...}) keeps a histogram of |x| per tensor in its session (forward bins each
tensor where it lives and sends the counts) and clips at the amax its method chooses,
which clips some kinds of outliers and not others (docs/histograms.md, "Choosing a
calibrator", examples/calibrator_choice.py); data-parallel ranks observing into one
session get the single-process result bit for bit, whatever the split or order
(examples/histogram_calibration.py).

Session names (see name_observers): weights after their parameters, activations
after the module output (eager) or module input (FX) they watch. The exports carry
those names; onnx_tensor_names maps them to an ONNX export's tensor names.

Runs: a run name is a namespace of sessions. Observing under a run whose sessions
were created before this process started is refused (AlreadyExists) unless the
observers say if_exists="resume" (add to them) or "replace" (start afresh);
data-parallel ranks of one run share the sessions their siblings create.
delete_run deletes a run.

Processes: an observer pickled to a "spawn" or "forkserver" child observes into the
same session from there. After fork() (multiprocessing's default on Linux, DataLoader
workers) the parent's observers and clients work on in both processes: a forked
child's first call starts a helper process that makes its calls (see
qparams/_fork_proxy.py for why gRPC's own fork support is not turned on), and
children that do not call the server never start one.

NVFP4: find_fused_groups names a model's fused groups (q/k/v, gate/up, an expert's
w1/w3, a MoE block's expert inputs) by module names, with hash-tagged session names that
keep each group on one replica; NVFP4Calibration calibrates the linears' weights (as
block ranges) and inputs into NVFP4 sessions with GLOBAL_AMAX groups of those, and
writes the compressed-tensors or ModelOpt checkpoint of the server's export
(read_checkpoint dequantizes one).

Quantization-aware training on data-parallel ranks: RemoteFakeQuantize is a torch.ao
fake-quantize module (FakeQuantize's contract, for prepare_qat and prepare_qat_fx)
whose running range is a step-merged session; QATRun drives a training loop's modules
with one Step call per rank per step, so that every rank fake-quantizes with the same
qparams, bit for bit one process's on the global batch, and restarts from a
checkpoint bit-identically (docs/qat.md, "Training with RemoteFakeQuantize"):

    qconfig = QConfig(activation=RemoteFakeQuantize.with_args(dtype=torch.quint8),
                      weight=RemoteFakeQuantize.with_args(
                          dtype=torch.qint8, qscheme=torch.per_tensor_symmetric))
    prepared = prepare_qat(model)              # model.qconfig = qconfig
    run = QATRun(client, prepared, prefix="job42/", lag=1)
    for s, batch in enumerate(batches):
        run.step(s)                            # before the step's forward
        ...                                    # forward, backward, optimizer step
    run.finish()
    quantized = convert(prepared.eval())

Errors of background observations are raised by the next forward, flush or
calculate_qparams of an observer using the same client, once, naming the session.
"""

from qparams.torch._fake_quantize import RemoteFakeQuantize
from qparams.torch._fused import (EXPERT_INPUTS, FUSED_SIBLINGS, FusedGroup, FusedGroups,
                                  find_fused_groups)
from qparams.torch._naming import parameter_names
from qparams.torch._nvfp4 import NVFP4Calibration, NVFP4Checkpoint, read_checkpoint
from qparams.torch._name_observers import name_observers
from qparams.torch._observer import RemoteObserver
from qparams.torch._onnx import onnx_tensor_names
from qparams.torch._qat_run import QATRun
from qparams.torch._registry import (close_clients, default_run, delete_run, flush_all,
                                     shared_client)

__all__ = ["RemoteObserver", "name_observers", "RemoteFakeQuantize", "QATRun", "onnx_tensor_names", "parameter_names",
           "shared_client", "flush_all", "close_clients", "default_run", "delete_run",
           "find_fused_groups", "FusedGroup", "FusedGroups", "FUSED_SIBLINGS", "EXPERT_INPUTS",
           "NVFP4Calibration", "NVFP4Checkpoint", "read_checkpoint"]
