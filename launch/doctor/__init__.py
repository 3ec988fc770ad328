"""`algo-train doctor`: proves, node by node and in minutes, that a cluster can run a given run — versions,
interfaces, shared storage, memory, and the real weight push (`weights`). Owns no run state; it may import
every launch package below it (it runs the run's own planning, preparation and roles), and nothing
imports it but `launch.cli`."""
