"""The commands a user types and what they see: the flags of a run (`run_flags`), `train` (run folder,
resolved config, resource plan, then the supervised child), `supervisor` (the child process and its
restarts), `evaluate` (`algo-train eval`), `plot`, `push` (`--push-to-hub`: the final export to the
Hugging Face Hub), and the console (which output reaches the terminal).
Owns the process a run lives in and its exit status; may import `loop`, `state`, `processes`, `prep`
and `planning`."""
