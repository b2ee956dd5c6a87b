"""Probe: at::sequence_number::peek through ctypes, against torch's own reading."""
import ctypes, glob, os, sys, time
import torch

lib = glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))[0]
h = ctypes.CDLL(lib)
fn = h._ZN2at15sequence_number4peekEv
fn.restype = ctypes.c_uint64
print("addr", hex(ctypes.cast(fn, ctypes.c_void_p).value))
x = torch.randn(4, 4, requires_grad=True)
a = fn(); b = torch.autograd._get_sequence_nr()
y = (x @ x).relu().sum()
c = fn(); d = torch.autograd._get_sequence_nr()
print("peek", a, b, c, d, "grad_fn seq", y.grad_fn._sequence_nr())
assert a == b and c == d and c - a == 3, (a, b, c, d)
print("cuda", torch.cuda.is_available())
