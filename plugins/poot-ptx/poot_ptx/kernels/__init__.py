"""NVIDIA's own kernels, as Kernel IR: tensor-core GEMMs (``mma``: mma.sync; ``wgmma``: Hopper's
warpgroup products) and prefill attention on tensor cores (``attention_mma``)."""
