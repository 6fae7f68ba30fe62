"""Hook implementation of relax-uniform (registration only; nothing heavy imported)."""

from relax_core import SamplerSpec, hookimpl


@hookimpl
def relax_register_samplers():
    return [SamplerSpec(
        name="uniform",
        summary="Every training row once per epoch, in a fresh seeded shuffle per epoch (the default).",
        source="Epoch-wise shuffling without replacement (Bottou 2009, 'Curiously fast convergence of some "
               "stochastic gradient descent algorithms')",
        factory="relax_uniform.sampler:build",
    )]
