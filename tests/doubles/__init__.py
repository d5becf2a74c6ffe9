"""Contract doubles of the fused libraries, computing with OUR reference.

Each double has the library's exact entry-point signatures and conventions (layouts, head rule, state
orientation, dtype rules, return shapes, how it refuses a configuration), so an adapter that passes
against the double has every conversion right; only the numbers differ from the real kernel.

One deliberate deviation: the doubles return their results in fp64 (the kernels round to the io dtype),
so an adapter's output can be compared with the fp64 oracle to ~1e-12.
"""
