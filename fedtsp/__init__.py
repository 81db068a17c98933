"""fedtsp: federated learning with text-derived class prototypes (FedTSP) and FMCL."""

__version__ = "0.1.0"
