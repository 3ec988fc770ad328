"""The evidence studies: does each algorithm do what its paper says (`evidence` runs and analyses them,
`evidence_studies` holds their arms and overrides, `evidence_traces` their training metrics over a run,
`response_shapes` the shapes of responses over training, `testbed_prep` the step-by-step testbed's build,
`study_tests` the registered tests, `records` keeps a study's finished runs in the repository, in records/).
May import `perf` and `common`."""
