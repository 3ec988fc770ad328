"""The training loop: `graph.run_graph` wires the process graph and hands it to the `driver`, which pulls a
batch, steps the learner, pushes weights and settles prompts; `metrics` (one writer per key),
`progress` (the live line), `samples` and `staleness_auto` (the bound K chosen by measurement) serve it.
Owns the step and its row of metrics; may import `state`, `processes`, `prep` and `planning`."""
