"""A pretend GPU for CPU CI: tensors that say they live on "cuda:0" and behave as a
device tensor does where it matters, so a CUDA-only crash or a host sync per token
shows up without a GPU.

Inside `FakeCuda()`:
- a tensor created on, or moved to, "cuda" is a `DeviceTensor` (CPU data underneath)
  whose `.device` is cuda:0;
- `.numpy()` on one raises TypeError, as on a GPU;
- an op mixing one with a CPU tensor of more than one element raises, as on a GPU
  (copies, and indexing a device tensor by host indices, are allowed there too);
- every host read of one (`.tolist()`, `.item()`, `bool()`, `int()`, `float()`, a
  blocking copy to the host, a blocking copy from the host) is counted in `syncs`,
  with its call site in `sites`, and so is `torch.cuda.synchronize`.
Generators made by verispec on "cuda" are CPU generators here (no CUDA build needed).
`ReplayedSteps` stands in for the CUDA graphs of the static path.
"""
from __future__ import annotations

import traceback
from collections import Counter

import torch
from torch.overrides import TorchFunctionMode

FAKE = torch.device("cuda", 0)
# A tensor property reaches a mode as its descriptor's __get__, a fresh method-wrapper
# each time: these are the descriptors it is bound to.
_DEVICE = torch._C.TensorBase.__dict__["device"]
_IS_CUDA = torch._C.TensorBase.__dict__["is_cuda"]
_HOST_READS = {torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.__bool__,
               torch.Tensor.__int__, torch.Tensor.__float__, torch.Tensor.__index__}
_MIXING_ALLOWED = {torch.Tensor.copy_, torch.Tensor.__getitem__, torch.Tensor.__setitem__,
                   torch.Tensor.index_put_, torch.Tensor.to, torch.Tensor.cpu,
                   torch.Tensor.cuda, torch.Tensor.type_as, torch._has_compatible_shallow_copy_type}


class DeviceTensor(torch.Tensor):
    """A CPU tensor marked as living on the fake GPU; `FakeCuda` gives it meaning."""
    __torch_function__ = torch._C._disabled_torch_function_impl


def on_fake(t) -> bool:
    return isinstance(t, DeviceTensor)


def _plain(t):
    return t.as_subclass(torch.Tensor) if isinstance(t, DeviceTensor) else t


def _mark(value):
    if isinstance(value, torch.Size):
        return value
    if isinstance(value, torch.Tensor) and not isinstance(value, DeviceTensor):
        return value.as_subclass(DeviceTensor)
    if isinstance(value, (tuple, list)):
        marked = [_mark(v) for v in value]
        return tuple(marked) if type(value) is tuple else type(value)(marked)  # keeps topk's names
    return value


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)


def _unwrap(value):
    if isinstance(value, torch.Tensor):
        return _plain(value)
    if isinstance(value, (tuple, list)):
        return type(value)(_unwrap(v) for v in value)
    if isinstance(value, dict):
        return {k: _unwrap(v) for k, v in value.items()}
    return value


def _is_cuda(device) -> bool:
    if device is None:
        return False
    if isinstance(device, torch.device):
        return device.type == "cuda"
    return isinstance(device, str) and device.startswith("cuda")


def _is_place(value) -> bool:
    return isinstance(value, (str, torch.device)) or (isinstance(value, torch.Tensor))


def _move(func, args, kwargs):
    """A .to()/.cuda()/.cpu() call as (where it sends the tensor: "cuda", "cpu" or
    None to stay, the remaining dtype arguments)."""
    if func is torch.Tensor.cuda:
        return "cuda", {}
    if func is torch.Tensor.cpu:
        return "cpu", {}
    rest = dict(kwargs)
    target = None
    device = rest.pop("device", None)
    if device is not None:
        target = "cuda" if _is_cuda(device) else "cpu"
    for value in args[1:]:
        if isinstance(value, torch.dtype):
            rest["dtype"] = value
        elif isinstance(value, torch.Tensor):
            target = "cuda" if on_fake(value) else "cpu"
            rest["dtype"] = value.dtype
        elif isinstance(value, (str, torch.device)):
            target = "cuda" if _is_cuda(value) else "cpu"
    return target, rest


class FakeCuda(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.syncs = 0
        self.sites: Counter[str] = Counter()
        self._saved = {}

    def __enter__(self):
        self._saved = {"synchronize": torch.cuda.synchronize, "generator": torch.Generator,
                       "overwrite": torch.__future__.get_overwrite_module_params_on_conversion()}
        # Module.to("cuda") then swaps in the moved tensors, so parameters are on the fake
        # GPU too (by default it assigns their .data, which drops the marker).
        torch.__future__.set_overwrite_module_params_on_conversion(True)
        torch.cuda.synchronize = lambda *a, **k: self._sync("torch.cuda.synchronize")
        real = self._saved["generator"]

        def generator(device="cpu"):
            return real(device="cpu")

        import verispec.sampling as sampling

        self._saved["sampling_torch"] = sampling.torch
        sampling.torch = _TorchWithFakeGenerator(generator)
        return super().__enter__()

    def __exit__(self, *exc):
        torch.cuda.synchronize = self._saved["synchronize"]
        torch.__future__.set_overwrite_module_params_on_conversion(self._saved["overwrite"])
        import verispec.sampling as sampling

        sampling.torch = self._saved["sampling_torch"]
        return super().__exit__(*exc)

    def _sync(self, what: str) -> None:
        self.syncs += 1
        frames = [f for f in traceback.extract_stack()
                  if "fake_cuda" not in f.filename and "/torch/" not in f.filename]
        where = frames[-1] if frames else None
        self.sites[f"{what} at {where.filename.split('/')[-1]}:{where.lineno}" if where else what] += 1

    def reset(self) -> None:
        self.syncs = 0
        self.sites.clear()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch._C._nn._parse_to:  # Module.to's parser: "cuda" stays a device name
            return func(*args, **kwargs)
        getter = getattr(func, "__self__", None)
        if getter is _DEVICE:
            return FAKE if on_fake(args[0]) else func(*args)
        if getter is _IS_CUDA:
            return on_fake(args[0])
        fake_in = [t for t in _tensors((args, kwargs)) if on_fake(t)]
        if func is torch.Tensor.numpy and fake_in:
            raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() "
                            "to copy the tensor to host memory first.")
        if func in _HOST_READS and fake_in:
            self._sync(func.__name__)
        if func in (torch.Tensor.to, torch.Tensor.cpu, torch.Tensor.cuda):
            target, rest = _move(func, args, kwargs)
            source = args[0]
            target = target or ("cuda" if on_fake(source) else "cpu")
            moves = target != ("cuda" if on_fake(source) else "cpu")
            if moves and target == "cpu":
                self._sync("copy to host")
            if moves and target == "cuda" and not rest.pop("non_blocking", False):
                self._sync("blocking copy to device")
            rest.pop("non_blocking", None)
            out = _plain(source).to(**rest) if rest else _plain(source)
            if target == "cpu":
                return out.clone() if on_fake(source) and out is not None else out
            return _mark(out)
        if func is torch.Tensor.copy_ and len(args) > 1:
            if on_fake(args[0]) and not on_fake(args[1]) and not kwargs.get("non_blocking", False):
                self._sync("blocking copy to device")
            if not on_fake(args[0]) and on_fake(args[1]):
                self._sync("copy to host")
        wants_cuda = _is_cuda(kwargs.get("device"))
        if wants_cuda:
            kwargs["device"] = "cpu"
            if func in (torch.tensor, torch.as_tensor):
                self._sync("blocking copy to device")
        if (func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__) and fake_in
                and not on_fake(args[0])):
            raise RuntimeError("indices should be either on cpu or on the same device as the "
                               "indexed tensor (cpu)")
        if fake_in and func not in _MIXING_ALLOWED:
            mixed = [t for t in _tensors((args, kwargs)) if not on_fake(t) and t.dim() > 0
                     and t.numel() > 1]
            if mixed:
                raise RuntimeError(f"{getattr(func, '__name__', func)}: expected all tensors to be "
                                   f"on the same device, but found cuda:0 and cpu "
                                   f"(a host tensor of shape {tuple(mixed[0].shape)})")
        out = func(*_unwrap(args), **_unwrap(kwargs))
        if func in _HOST_READS or func is torch.Tensor.numpy:
            return out
        if (fake_in and func not in (torch.Tensor.__setitem__,)) or wants_cuda:
            if func is torch.Tensor.__getitem__ and not on_fake(args[0]):
                return out
            return _mark(out)
        return out


class _TorchWithFakeGenerator:
    """verispec.sampling's view of torch inside FakeCuda: Generator(device="cuda") is a
    CPU generator, everything else is torch."""

    def __init__(self, generator) -> None:
        self.Generator = generator

    def __getattr__(self, name):
        return getattr(torch, name)


class ReplayedSteps:
    """Stands in for step_graphs.StepGraphs on CPU: runs the step eagerly but, as a
    graph's replay does, leaves every run's outputs in the same tensors."""

    def __init__(self, step) -> None:
        self.step, self.keys, self._kept = step, set(), {}

    def run(self, slab, kv, hidden_layers):
        self.keys.add((slab, hidden_layers))
        out = self.step(kv, hidden_layers)
        kept = self._kept.setdefault((slab, hidden_layers), out)
        for mine, new in zip((kept.logits, kept.greedy, *kept.hidden),
                             (out.logits, out.greedy, *out.hidden)):
            mine.copy_(new)
        return kept
