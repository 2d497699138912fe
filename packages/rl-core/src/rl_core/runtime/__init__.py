"""The runtime: device meshes, multi-host setup, compilation caching, CPU randomness, host memory, HLO."""
