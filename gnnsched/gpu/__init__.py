"""GPUs: the catalogue of models and their device constants, the NVML backend (real or fake) the node components read,
the fake GPU's memory and fault stand-ins, and the guard that keeps CUDA closed until the gate admits a worker."""
