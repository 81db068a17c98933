"""fedtsp: federated learning with text-derived class prototypes (FedTSP) and FMCL."""

# Before anything below imports torch or NumPy: pin their CPU kernels to AVX2 (or honour the
# user's choice), so that every record's bits are the same on any x86-64 machine.
from fedtsp.core import isa as _isa

_isa.configure()

__version__ = "0.1.0"
