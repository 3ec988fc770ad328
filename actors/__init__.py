"""Actors: one vLLM `AsyncLLM` each, generating whole groups with behaviour log-probs and per-token
weight versions, scoring verifiable rewards, LUFFY prefix rollouts, and streaming groups to the buffer
under its credit-based admission.

  actors.actor.RolloutActor   synchronous API for the orchestrator / serial mode / tests
  actors.core.AsyncActor      the same actor for callers that own an event loop
  actors.host.EngineHost      an engine on its own event-loop thread (shareable, e.g. by tests)
  actors.weights              weight updates through weightsync's receiver (pause keep -> load -> resume)
  actors.engine               engine arguments and start-up
  actors.generate             sampling + scoring one group, evaluation
  actors.deadlines            progress deadline, group budget, wedged-engine detection of rollout requests
  actors.rows                 vLLM completions -> buffer.records.Sample (versions, log mu)
  actors.luffy                demonstration-guided rows
  actors.link                 buffer client thread, reconnects, outbox of un-acknowledged groups
  actors.prompts              tokenised prompts, sharding, resumable cursor

Heavy modules (vllm) are imported lazily, so `import actors` is cheap.
"""
