//! An in-process Kubernetes API server emulator for inplace's tests, demo and benchmarks.
