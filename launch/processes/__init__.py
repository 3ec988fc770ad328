"""The roles placed on the cluster: `process_graph.ProcessGraph` (learner ranks and rollout actors as Ray
actors, the weight-sync group they form, their deaths as `RoleLost`/`LearnerDied`), `roles` (the learner
rank) and `actor_role` (an actor as placed), `joining` (engines sharing a GPU start in turn; a weight-sync
group that does not form is one line), the teacher's engines in the driver (`teacher_role`: LUFFY's live traces;
`teacher_scorer` with `teacher_scores`: distillation's log-probs, teacher.scoring=engine). Owns the live processes;
may import `prep` and `planning`."""
