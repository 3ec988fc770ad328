"""The NCCL transport (GPU to GPU through vLLM's NCCL pieces): the learner's data plane (`plane`) and the
worker end inside each vLLM engine (`engine`, which reuses the gloo engine's control-plane half), and
what both use of the communicator (`comm`: its gate and the deadline of every blocking call). Imports
the shared protocol and `weightsync.gloo.engine`; nothing imports it but the backend table's names."""
