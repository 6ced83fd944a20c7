"""autoseq against its peers, side by side, in one run: ``python -m benchmarks [--quick]``.

Every comparison runs each contender in the same process, on the same
servers, in interleaved repeats; the headline is the ratio of medians of
autoseq to each peer, with the spread of the paired ratios beside it.
See ``benchmarks/README.md`` for the method and the latest figures.
"""
