"""What a run starts from, prepared in the driver before anything is placed: prompts and demonstrations
(`data`, `demo_batches`), the model (`model_prep`: a local HF directory, a Hub id's snapshot in the local
HF cache (`hub`), or the warmed-up tiny model) and `preflight`, the check of every file and plugin a run
names. May import `planning` only."""
