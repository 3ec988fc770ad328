"""The models that score the policy's rollouts for the process-reward algorithms, as learner providers:
PURE's PRM and its "process_rewards" provider (`pure`), PRIME's implicit PRM (`prime`), and how a PRM's
verdicts agree with the step checker and the verifier (`agreement`). They may import the learner's own
modules (provider_base, fsdp, logprobs, distributed), `algos` and `tasks`; nothing in the learner's
folder imports them but `providers` (the registry of providers) and `checkpoint`."""
