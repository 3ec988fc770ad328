"""The chaos bench: a real run whose processes are killed or stuck where it hurts (`chaos`), the fault injector
(`chaos_monkey`, `chaos_procs`), what the run's console says (`chaos_console`), the prompt-ledger check
(`chaos_audit`) and the report (`chaos_report`). May import `perf` and `common`."""
