"""Run state and recovery: the run folder (`rundir`, `storage`), the prompt ledger (the one owner of
prompt progress) and the run's position, checkpoints (`run_checkpoints`), the buffer process (`buffer_keeper`)
and `recovery` (a dead actor or buffer replaced without losing or repeating a prompt). Owns everything a
resume reads; may import `processes`, `prep` and `planning`."""
