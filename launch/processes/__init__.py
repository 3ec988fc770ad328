"""The roles placed on the cluster: `process_graph.ProcessGraph` (learner ranks and rollout actors as Ray
actors, the weight-sync group they form, their deaths as `RoleLost`/`LearnerDied`), `roles` (the learner
rank) and `actor_role` (an actor as placed), `joining` (engines sharing a GPU start in turn; a weight-sync
group that does not form is one line). Owns the live processes; may import `prep` and `planning`."""
