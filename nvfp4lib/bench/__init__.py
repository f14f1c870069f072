"""The measuring layer: the benchmark harness, the peers, the roofline, the call/MoE/gather benches and the results
store (`data/`). It imports the core (:mod:`nvfp4lib`), never the study."""
